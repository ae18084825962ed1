"""Pruned models out of headprune: stock HF checkpoints, ONNX and GGUF files, each checked without headprune."""

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from torch import nn


@dataclass(frozen=True)
class ExportOptions:
    """What a writer may read besides the model: the GGUF dtype, the file's model name, GGUF ``tokenizer.ggml.pre`` (None: identified)."""

    gguf_dtype: str
    name: str
    tokenizer_pre: str | None


def write_hf(model: nn.Module, tokenizer, out: Path, example: dict, options: ExportOptions) -> dict:
    """A directory stock transformers loads with ``AutoModelForCausalLM``."""
    from headprune.export.hf import export_hf

    job = {"dir": str(out), "auto_class": "AutoModelForCausalLM", "tokenizer": tokenizer is not None}
    return {"files": export_hf(model, tokenizer, out), "job": job}


def write_onnx(model: nn.Module, tokenizer, out: Path, example: dict, options: ExportOptions) -> dict:
    """``model.onnx``, or ``encoder.onnx`` + ``decoder.onnx``, traced on ``example``."""
    from headprune.export.onnx import export_onnx
    from headprune.export.onnx_dir import write_onnx_dir

    graphs = export_onnx(model, example, out)
    job = {"files": {k: str(v) for k, v in graphs.items()}}
    return {"files": write_onnx_dir(model, tokenizer, out, graphs), "graphs": graphs, "job": job}


def write_gguf(model: nn.Module, tokenizer, out: Path, example: dict, options: ExportOptions) -> dict:
    """One GGUF file for llama.cpp: the family's architecture (gguf_archs.py), or ``deci`` for uneven Llama layers."""
    from headprune.export.gguf_deci import write_gguf as write

    written = write(model, tokenizer, out, options.gguf_dtype, options.name, options.tokenizer_pre)
    path = written["path"]
    job = {
        "dir": str(out),
        "gguf_file": path.name,
        "auto_class": "AutoModelForCausalLM",
        "tokenizer_pre": written["tokenizer_pre"],
    }
    if not written["transformers_reads"]:  # deci, qwen2...: the checker reads it with the gguf package (transformers' reader
        # cannot read deci, and derives other families' head size from hidden_size / heads)
        job.update(
            reader="gguf-numpy",
            architecture=written["architecture"],
            layout={k: written[k] for k in ("head_count", "head_count_kv", "feed_forward_length")},
        )
    return {"files": [path], "architecture": written["architecture"], "job": job}


def write_deci_hf(model: nn.Module, tokenizer, out: Path, example: dict, options: ExportOptions) -> dict:
    """A DeciLMForCausalLM directory for vLLM; the check runs it with the reference forward of its block_configs."""
    from headprune.export.deci_hf import export_deci_hf

    written = export_deci_hf(model, tokenizer, out)
    job = {"dir": str(out), "layout": written["layout"], "tokenizer": tokenizer is not None}
    return {"files": written["files"], "job": job, **{k: written[k] for k in ("layout", "padded_query_heads", "placeholder_layers")}}


def _lazy(path: str) -> Callable:
    """The function ``headprune.export.<path>``, imported when first called (a format's module imports its own dependencies)."""
    module, name = path.rsplit(".", 1)

    def call(*args):
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)(*args)

    return call


@dataclass(frozen=True)
class Format:
    """An export format: its writer, what it demands of the model and the settings, and how the checker reads its files."""

    write: Callable[..., dict]  # (model, tokenizer, out, example, ExportOptions) -> {"files", "job", ...}
    decoder_only: bool  # Llama-family decoders with a stock layer shape only (headprune.export.hf.STOCK_TYPES)
    quantize: tuple[str, ...]  # export.quantize values it takes
    reads: tuple[str, ...]  # export.* settings only this format reads
    rounds_weights: bool  # the file stores rounded weights (gguf f16): the check compares with the model as rounded
    reader: str  # how the checker runs its files (checker.READERS); a writer may name another in its job (GGUF's deci)
    family_refusal: Callable[[dict], str | None] | None = None  # config fields -> why the family cannot be written
    check_mask: Callable[[dict, dict], None] | None = None  # (config fields, {group: query-head mask rows}) -> ConfigError


FORMATS: dict[str, Format] = {
    "hf": Format(write_hf, True, ("none",), (), False, "transformers", _lazy("hf.family_refusal"), _lazy("hf.check_mask")),
    "onnx": Format(write_onnx, False, ("none", "int8"), ("quantize", "per_channel"), False, "onnxruntime"),
    "gguf": Format(
        write_gguf,
        True,
        ("none",),
        ("gguf_dtype", "tokenizer_pre"),
        True,
        "transformers",
        _lazy("gguf.refusal"),
        _lazy("gguf_deci.check_mask"),
    ),
    "deci_hf": Format(write_deci_hf, True, ("none",), (), False, "deci-torch", _lazy("deci_hf.refusal"), _lazy("deci_hf.check_mask")),
}


def export_model(
    fmt: str,
    model: nn.Module,
    tokenizer,
    out: Path,
    example: dict,
    gguf_dtype: str = "f32",
    name: str = "model",
    tokenizer_pre: str | None = None,
) -> dict:
    """Write ``model`` (physically pruned, its own attention) in format ``fmt`` into ``out``: {"files": [...], "job": {...}}."""
    if fmt not in FORMATS:
        raise ValueError(f"export.format must be one of {list(FORMATS)}, got {fmt!r}")
    written = FORMATS[fmt].write(model, tokenizer, out, example, ExportOptions(gguf_dtype, name, tokenizer_pre))
    written["job"] = {"format": fmt, "reader": FORMATS[fmt].reader, **written["job"]}  # a writer may name another reader
    return written
