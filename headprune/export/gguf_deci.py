"""llama.cpp ``deci`` GGUF files of Llama-family decoders pruned unevenly: per-layer head counts and FFN widths."""

from pathlib import Path

from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.checks import ConfigError
from headprune.core.ffn.sites import find_ffn_sites
from headprune.export.gguf import LLAMA, check_bpe, check_writable, export_gguf, layer_index, square_message, write_file
from headprune.export.gguf_archs import arch_of
from headprune.export.gguf_pre import pre_tokenizer_of
from headprune.export.hf import check_phantoms, heads_per_kv, kept_per_kv, layer_shape

ATTENTION_PARTS = (".self_attn.", ".input_layernorm.")  # the tensors a layer without attention leaves out
FFN_PARTS = (".mlp.", ".post_attention_layernorm.")  # the tensors a layer without FFN leaves out


def uneven_groups_message(layer: int, kept_per_kv: list[int]) -> str:
    """Why a layer with unequal query groups under its KV heads cannot be written as GGUF, and what works."""
    return (
        f"export.format=gguf: layer {layer} keeps {kept_per_kv} query heads under its KV heads; llama.cpp (deci, like every "
        "grouped-query runtime) gives each KV head of a layer the same number of query heads, so this layout has no GGUF "
        "form. Prune whole KV groups (prune.unit=kv_group), or export it with export.format=onnx, which takes any layout"
    )


def mask_layer_shapes(rows: list[list[int]], heads_per_kv: int) -> list[tuple[int, int]]:
    """(query heads, KV heads) of every layer under a 0/1 query-head mask [layers][heads], or a ConfigError."""
    shapes = []
    for layer, row in enumerate(rows):
        per_kv = kept_per_kv(row, heads_per_kv)
        shape = layer_shape(per_kv)
        if shape is None:
            raise ConfigError(uneven_groups_message(layer, per_kv))
        shapes.append(shape)
    return shapes


def check_mask(fields: dict, rows: dict) -> None:
    """A ConfigError unless GGUF holds the head mask: equal query groups under each kept KV head; one shape per layer without deci."""
    row = arch_of(fields.get("model_type"))
    for layers in rows.values():
        pruned = [layer for layer, kept in enumerate(layers) if 0 in kept]
        if row is not None and row.square_only and pruned:
            raise ConfigError(square_message(fields.get("model_type"), f", and the mask prunes query heads in layers {pruned}"))
        shapes = mask_layer_shapes(layers, heads_per_kv(fields))
        if row is not None and not row.per_layer and len(set(shapes)) > 1:
            raise ConfigError(uneven_layers_message(row, shapes))


def uneven_layers_message(row, shapes: list) -> str:
    """Why an architecture that holds one attention shape and one FFN width cannot take these per-layer ``shapes``."""
    return (
        f"export.format=gguf writes {'/'.join(row.model_types)} as llama.cpp's {row.name} architecture, which holds one "
        f"attention shape and one FFN width for every layer; this layout has per-layer {shapes}: prune the same number of "
        f"KV groups and FFN neurons in every layer, or use {row.uneven_instead}"
    )


def model_layer_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """(query heads, KV heads) of every layer of a physically pruned model ((0, 0) when emptied), or a ConfigError."""
    shapes = []
    for site in find_sites(model):
        per_kv = [sum(1 for h in site.head_ids if site.kv_of(h) == kv) for kv in site.kv_ids]
        shape = layer_shape(per_kv)
        if shape is None or (site.head_ids and site.kv_index is not None):
            raise ConfigError(uneven_groups_message(site.layer, per_kv))
        shapes.append(shape)
    return shapes


def written_shapes(shapes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The per-layer counts the deci file holds: an emptied layer 0 keeps one all-zero head (llama.cpp reads the head size there)."""
    return [(1, 1) if layer == 0 and heads == 0 else (heads, kv) for layer, (heads, kv) in enumerate(shapes)]


def written_ffn_widths(written: list[tuple[int, int]], widths: list[int]) -> list[int]:
    """The per-layer ``feed_forward_length`` of the deci file: neurons kept, 0 or 1 for an emptied block."""
    # 0 ends a deci layer before its attention output is added, so only a layer without attention says 0; the last layer
    # keeps its zero neuron (1) because deci selects the output rows after the last FFN, which 0 would skip
    last = len(written) - 1
    return [
        width if width else (0 if heads == 0 and layer != last else 1) for layer, ((heads, _), width) in enumerate(zip(written, widths))
    ]


def export_gguf_deci(
    model: nn.Module, tokenizer, out: Path, dtype: str = "f32", name: str = "model", tokenizer_pre: str | None = None
) -> Path:
    """Write ``<out>/<name>-<dtype>.gguf`` of an unevenly pruned Llama or Mistral model as llama.cpp's deci; the file."""
    check_writable(model, dtype)
    shapes = written_shapes(model_layer_shapes(model))
    feed_forward = written_ffn_widths(shapes, [site.width for site in find_ffn_sites(model)])
    emptied = {layer for layer, (heads, _) in enumerate(shapes) if heads == 0}
    ffn_free = {layer for layer, width in enumerate(feed_forward) if width == 0}
    check_phantoms(model, emptied, ffn_free)
    head_dim = int(find_sites(model)[0].head_dim)

    def left_out(hf_name: str) -> bool:
        if any(part in hf_name for part in ATTENTION_PARTS):
            return layer_index(hf_name) in emptied
        return any(part in hf_name for part in FFN_PARTS) and layer_index(hf_name) in ffn_free

    return write_file(model, tokenizer, out, (dtype, name, tokenizer_pre), LLAMA, shapes, head_dim, feed_forward, deci=True, skip=left_out)


def write_gguf(model: nn.Module, tokenizer, out: Path, dtype: str = "f32", name: str = "model", tokenizer_pre: str | None = None) -> dict:
    """Write the GGUF file (``llama`` if every layer keeps one shape dividing the width, else ``deci``); returns its per-layer counts."""
    check_writable(model, dtype)  # before the layer shapes: a family GGUF cannot store is told so
    shapes, widths = model_layer_shapes(model), [site.width for site in find_ffn_sites(model)]  # FFN neurons kept (0: emptied)
    check_bpe(tokenizer)
    tokenizer_pre = pre_tokenizer_of(tokenizer, tokenizer_pre)  # named, or identified as llama.cpp's converter does
    model_type, hidden, head_dim = model.config.model_type, int(model.config.hidden_size), int(find_sites(model)[0].head_dim)
    row, not_square = arch_of(model_type), next((heads for heads, _ in shapes if heads * head_dim != hidden), None)
    if row.square_only and not_square is not None:  # gpt2 / gptneox: any pruned query head, before the layers' shapes are compared
        raise ConfigError(square_message(model_type, f" ({hidden}), and this model keeps {not_square} query heads of {head_dim}"))
    kept_widths = set(widths) or {1}
    uniform = len(set(shapes)) == 1 and shapes[0][0] > 0 and len(kept_widths) == 1 and min(kept_widths) > 0  # none emptied
    if not row.per_layer and not uniform:  # one shape and one FFN width
        raise ConfigError(uneven_layers_message(row, [(*shape, width) for shape, width in zip(shapes, widths)]))
    if not row.per_layer or (uniform and hidden % shapes[0][0] == 0):  # llama: its heads divide the width
        path, architecture = export_gguf(model, tokenizer, out, dtype, name, tokenizer_pre)
    else:
        path, architecture, shapes = export_gguf_deci(model, tokenizer, out, dtype, name, tokenizer_pre), "deci", written_shapes(shapes)
        widths = written_ffn_widths(shapes, widths)
    return {
        "path": path,
        "architecture": architecture,
        "head_count": [h for h, _ in shapes],
        "head_count_kv": [kv for _, kv in shapes],
        "feed_forward_length": widths,
        "tokenizer_pre": tokenizer_pre,
        "transformers_reads": architecture == "llama" and model_type in ("llama", "mistral"),
    }
