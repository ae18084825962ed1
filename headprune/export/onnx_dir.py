"""The self-contained ONNX export directory: graphs, tokenizer, config and a description of the graphs' inputs and outputs."""

import copy
import json
import shutil
from pathlib import Path

from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.ffn.sites import ffn_sites_if_any
from headprune.export.tokenizer_files import save_tokenizer

DESCRIPTION = "headprune_export.json"
HEADS_FIELD = "headprune_heads_per_layer"
ELEMENT_TYPES = {1: "float32", 6: "int32", 7: "int64", 10: "float16", 11: "float64"}  # onnx.TensorProto codes


def heads_per_layer(model: nn.Module) -> dict[str, dict[str, list[int]]]:
    """{group: {"query_heads": [per layer], "kv_heads": [per layer]}}: the heads each attention module keeps."""
    out: dict[str, dict[str, list[int]]] = {}
    for site in sorted(find_sites(model), key=lambda s: (s.group, s.layer)):
        group = out.setdefault(site.group, {"query_heads": [], "kv_heads": []})
        group["query_heads"].append(len(site.head_ids))
        group["kv_heads"].append(len(site.kv_ids) if site.num_kv_heads_orig else len(site.head_ids))
    return out


def ffn_widths_per_layer(model: nn.Module) -> dict[str, list[int]]:
    """{FFN group: [neurons each feed-forward block keeps]} (0: an emptied block, which computes one zero neuron)."""
    out: dict[str, list[int]] = {}
    for site in ffn_sites_if_any(model):
        out.setdefault(site.group, []).append(site.width)
    return out


def graph_signature(path: Path) -> dict:
    """{"inputs": [...], "outputs": [...]} of an ONNX file, each {"name", "type", "shape"} (axis names or sizes)."""
    import onnx

    graph = onnx.load(str(path), load_external_data=False).graph
    signature = {"inputs": [], "outputs": []}
    for side, values in (("inputs", graph.input), ("outputs", graph.output)):
        for value in values:
            tensor = value.type.tensor_type
            kind = ELEMENT_TYPES.get(tensor.elem_type, str(tensor.elem_type))
            signature[side].append({"name": value.name, "type": kind, "shape": [d.dim_param or d.dim_value for d in tensor.shape.dim]})
    return signature


def task_of(model: nn.Module) -> str:
    """The pipeline task name of the model's head (what optimum's ORTModel class is for)."""
    if type(model).__name__.endswith("ForImageClassification"):  # the head says the task, whatever its input is called
        return "image-classification"
    if getattr(model.config, "is_encoder_decoder", False):
        return "text2text-generation"
    return "text-generation" if model.can_generate() else "text-classification"


def text_inputs(model: nn.Module, tokenizer, task: str) -> dict:
    """How raw text becomes the graph's inputs with the ``tokenizers`` library alone."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
    recipe = {
        "tokenizer": "tokenizer.json",
        "pad_token_id": pad,
        "padding_side": "right",
        "attention_mask": "1 for real tokens, 0 for padding",
    }
    if task == "text-generation":  # headprune's language-modelling convention: BOS, then the text without special tokens
        bos = model.config.bos_token_id if model.config.bos_token_id is not None else tokenizer.bos_token_id
        return {
            **recipe,
            "add_special_tokens": False,
            "prepend_token_id": bos,
            "how": "ids = [prepend_token_id] + Tokenizer.encode(text, add_special_tokens=False).ids; logits[b, t] predicts "
            "token t + 1; no KV cache: greedy decoding appends the argmax of the last real position and runs again",
        }
    return {
        **recipe,
        "add_special_tokens": True,
        "prepend_token_id": None,
        "how": "Tokenizer.encode(text) or Tokenizer.encode(text, text_pair) for sentence pairs (NLI: premise, hypothesis); "
        "token_type_ids from the encoding's type_ids where the graph takes them",
    }


def image_inputs(processor) -> dict:
    """How an image becomes the graph's ``pixel_values`` with the saved image processor's numbers."""
    size = {k: v for k, v in dict(processor.size).items() if v is not None}
    return {
        "processor": "preprocessor_config.json",
        "size": size,
        "rescale_factor": processor.rescale_factor,
        "image_mean": list(processor.image_mean),
        "image_std": list(processor.image_std),
        "how": "RGB image resized to size, times rescale_factor, minus image_mean, over image_std, channels first: "
        "pixel_values (batch, channels, height, width) float32; a 1-channel model takes the first channel",
    }


def write_onnx_dir(model: nn.Module, tokenizer, out: Path, graphs: dict[str, Path], precision: str = "f32") -> list[Path]:
    """Write config.json, the tokenizer and ``headprune_export.json`` beside ``graphs`` in ``out``; every file of the directory."""
    out.mkdir(parents=True, exist_ok=True)
    task = task_of(model)
    config = copy.deepcopy(model.config)
    setattr(config, HEADS_FIELD, heads_per_layer(model))
    if task == "text-generation":
        config.use_cache = False  # the graphs take no past key values
    config.save_pretrained(out)
    if task not in ("text-classification", "image-classification"):
        model.generation_config.save_pretrained(out)
    images = task == "image-classification"  # ``tokenizer`` is then the model's image processor
    if tokenizer is not None:
        tokenizer.save_pretrained(out) if images else save_tokenizer(tokenizer, out, pad_to_longest=True)
    labels = getattr(config, "id2label", None) if task in ("text-classification", "image-classification") else None
    description = {
        "format": "onnx",
        "precision": precision,
        "task": task,
        "model_type": config.model_type,
        "architecture": type(model).__name__,
        "graphs": {name: {"file": Path(path).name, **graph_signature(Path(path))} for name, path in graphs.items()},
        "text_inputs": text_inputs(model, tokenizer, task) if tokenizer is not None and not images else None,
        **({"image_inputs": image_inputs(tokenizer)} if images and tokenizer is not None else {}),
        "labels": {str(k): v for k, v in labels.items()} if labels else None,
        "heads_per_layer": getattr(config, HEADS_FIELD),
        "ffn_widths_per_layer": ffn_widths_per_layer(model),
        "pruned_heads": getattr(config, "headprune_pruned_heads", None) or {},
        "kv_cache": False,
        "runtime": "onnxruntime (CPUExecutionProvider); tokenizers for text",
    }
    (out / DESCRIPTION).write_text(json.dumps(description, indent=1))
    return sorted(p for p in out.iterdir() if p.is_file())


def copy_onnx_dir(source: Path, out: Path, graphs: dict[str, Path], precision: str) -> list[Path]:
    """Make ``out`` (holding ``graphs``, e.g. their int8 versions) self-contained with the files of the export in ``source``."""
    description = json.loads((source / DESCRIPTION).read_text())
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".onnx" and path.name != DESCRIPTION:
            shutil.copy2(path, out / path.name)
    description.update(precision=precision, graphs={name: {"file": Path(p).name, **graph_signature(Path(p))} for name, p in graphs.items()})
    (out / DESCRIPTION).write_text(json.dumps(description, indent=1))
    return sorted(p for p in out.iterdir() if p.is_file())
