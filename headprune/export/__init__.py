"""Pruned models out of headprune: stock HF checkpoints, ONNX and GGUF files, each checked without headprune.

- ``hf`` (headprune.export.hf): a directory stock transformers loads (Llama, Mistral, Qwen2, Qwen3 decoders
  whose layers all keep the same heads: ``prune.layout=uniform``, with ``prune.unit=kv_group`` for
  grouped-query models);
- ``onnx`` (headprune.export.onnx): any encoder, decoder or encoder-decoder, uneven heads included
  (opset 17; ``int8``: dynamic quantisation by ONNX Runtime), in a directory with its tokenizer, config and
  description (headprune.export.onnx_dir) that plain ONNX Runtime runs from raw text (headprune.export.onnx_client);
- ``gguf`` (headprune.export.gguf, gguf_deci): llama.cpp's format for pruned Llama and Mistral decoders: its ``llama``
  architecture when every layer keeps one shape, its ``deci`` (per-layer head counts) for global masks.

``export_model`` writes one format and says how ``headprune.export.verify.check_export`` loads it back.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

FORMATS = ("hf", "onnx", "gguf")


def export_model(
    fmt: str,
    model: nn.Module,
    tokenizer,
    out: Path,
    example: dict,
    gguf_dtype: str = "f32",
    name: str = "model",
    tokenizer_pre: str = "default",
) -> dict:
    """Write ``model`` (physically pruned, its own attention) in format ``fmt`` into ``out``: {"files": [...], "job": {...}}.

    ``example`` is a batch of model inputs (ONNX traces on it); ``job`` tells the checker how to load the export.
    """
    if fmt == "hf":
        from headprune.export.hf import export_hf

        files = export_hf(model, tokenizer, out)
        return {
            "files": files,
            "job": {"format": "hf", "dir": str(out), "auto_class": "AutoModelForCausalLM", "tokenizer": tokenizer is not None},
        }
    if fmt == "onnx":
        from headprune.export.onnx import export_onnx
        from headprune.export.onnx_dir import write_onnx_dir

        graphs = export_onnx(model, example, out)
        return {
            "files": write_onnx_dir(model, tokenizer, out, graphs),
            "graphs": graphs,
            "job": {"format": "onnx", "files": {k: str(v) for k, v in graphs.items()}},
        }
    if fmt == "gguf":
        from headprune.export.gguf_deci import write_gguf

        written = write_gguf(model, tokenizer, out, gguf_dtype, name, tokenizer_pre)
        path = written["path"]
        job = {"format": "gguf", "dir": str(out), "gguf_file": path.name, "auto_class": "AutoModelForCausalLM"}
        if written["architecture"] == "deci":  # transformers cannot read deci: the checker reads it with the gguf package
            job.update(architecture="deci", layout={k: written[k] for k in ("head_count", "head_count_kv")})
        return {"files": [path], "architecture": written["architecture"], "job": job}
    raise ValueError(f"export.format must be one of {list(FORMATS)}, got {fmt!r}")
