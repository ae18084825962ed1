"""Stock transformers checkpoints of uniformly pruned Llama-like decoders: a directory ``AutoModelForCausalLM`` loads alone."""

import copy
from dataclasses import dataclass
from pathlib import Path

from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.checks import ConfigError
from headprune.core.ffn.pruning import WIDTHS_ATTR
from headprune.core.ffn.sites import ffn_sites_if_any
from headprune.core.layer.removal import REMOVED_ATTR
from headprune.core.pruning import RECORD_ATTR
from headprune.export.tokenizer_files import save_tokenizer

STOCK_TYPES = ("llama", "mistral", "qwen2", "qwen3", "granite", "gemma2", "gemma3_text", "phi3")
# config fields a written checkpoint does not copy: v4's head record, transformers' bookkeeping, what the writer sets itself
NOT_COPIED = ("pruned_heads", "_attn_implementation_autoset", "architectures", "transformers_version", "model_type")


@dataclass(frozen=True)
class StockShape:
    """The attention shape every layer of a stock checkpoint shares."""

    heads: int
    kv_heads: int
    head_dim: int


def stock_shape(model: nn.Module, types: tuple[str, ...] = STOCK_TYPES) -> StockShape:
    """The one attention shape of all layers of a (pruned) model of ``types``, or a ConfigError naming the layers that differ."""
    model_type = getattr(model.config, "model_type", None)
    if model_type not in types:  # types: STOCK_TYPES, or the GGUF writer's wider list
        raise ConfigError(family_refusal({"model_type": model_type}))
    shapes = {}
    for site in find_sites(model):
        uneven = site.kv_index is not None or not site.head_ids
        key = "uneven" if uneven else (len(site.head_ids), len(site.kv_ids), site.head_dim)
        shapes.setdefault(key, []).append(site.layer)
    _require_one_shape(shapes, "a stock checkpoint (export.format=hf or gguf) needs the same attention shape in every layer, but")
    return StockShape(*next(iter(shapes)))  # (heads, KV heads, head size)


def stock_ffn_width(model: nn.Module) -> dict[str, int]:
    """{config field: the one width every feed-forward block computes}, or a ConfigError naming the layers of each width."""
    widths: dict[str, dict[int, list[int]]] = {}
    for site in ffn_sites_if_any(model):
        widths.setdefault(site.config_field, {}).setdefault(site.computed_width, []).append(site.layer)
    for field, by_width in widths.items():
        if len(by_width) > 1:
            described = "; ".join(f"layers {layers}: {width} neurons" for width, layers in by_width.items())
            raise ConfigError(f"a stock checkpoint needs one FFN width ({field}) in every layer, but {described}. " + UNIFORM_HINT)
    return {field: next(iter(by_width)) for field, by_width in widths.items()}


def _require_one_shape(shapes: dict, lead: str) -> None:
    """A ConfigError naming the layers of each shape unless ``shapes`` ({shape or "uneven": [layers]}) holds one even shape."""
    if len(shapes) == 1 and "uneven" not in shapes:
        return
    uneven = "query heads unevenly spread over their KV heads (or none left)"
    words = {key: uneven if key == "uneven" else f"{key[0]} query heads over {key[1]} KV heads" for key in shapes}
    described = "; ".join(f"layers {layers}: {words[key]}" for key, layers in shapes.items())
    raise ConfigError(f"{lead} {described}. " + UNIFORM_HINT)


UNIFORM_HINT = (
    "Prune with prune.layout=uniform (with prune.unit=kv_group for grouped-query models, so that every KV head keeps "
    "all of its query heads), or export with export.format=onnx (any layout), or keep headprune's own format "
    "(headprune.save_pruned / load_pruned)."
)


def family_refusal(fields: dict) -> str | None:
    """Why export.format=hf cannot write a model of these config fields (None when it can): what works instead."""
    model_type = fields.get("model_type")
    if model_type in STOCK_TYPES:
        return None
    return (
        f"export.format=hf writes stock transformers checkpoints of Llama-family decoders only ({', '.join(STOCK_TYPES)}); "
        f"model {model_type!r} cannot hold pruned heads in a stock config (BERT- and BART-like configs derive the head "
        "size from hidden_size / num_attention_heads and share one head count across layers). Use export.format=onnx, or "
        "headprune's own format (headprune.save_pruned / load_pruned)."
    )


def heads_per_kv(fields: dict) -> int:
    """Query heads per KV head of a config's fields (1 without grouped-query attention)."""
    return int(fields["num_attention_heads"]) // int(fields.get("num_key_value_heads") or fields["num_attention_heads"])


def kept_per_kv(row: list[int], heads_per_kv: int) -> list[int]:
    """The query heads a 0/1 mask row [heads] keeps under each KV head (repeat_kv's order: KV head k serves heads k*n ..)."""
    return [int(sum(row[k : k + heads_per_kv])) for k in range(0, len(row), heads_per_kv)]


def layer_shape(kept_per_kv: list[int]) -> tuple[int, int] | None:
    """(query heads, KV heads) of a layer from its kept query heads per original KV head; None when the groups are unequal."""
    kept = [count for count in kept_per_kv if count]
    if not kept:
        return (0, 0)
    return (sum(kept), len(kept)) if len(set(kept)) == 1 else None


def check_mask(fields: dict, rows: dict) -> None:
    """A ConfigError unless the query-head mask {group: [layers][heads]} keeps one stock shape in every layer."""
    for layers in rows.values():
        shapes: dict = {}  # {(query heads, KV heads) or "uneven" (or none left): [layers]}
        for layer, row in enumerate(layers):
            shape = layer_shape(kept_per_kv(row, heads_per_kv(fields)))
            shapes.setdefault(shape if shape and shape[0] else "uneven", []).append(layer)
        _require_one_shape(shapes, "a stock checkpoint needs the same attention shape in every layer, but the mask keeps")


def stock_config(model: nn.Module, shape: StockShape):
    """The config of the stock checkpoint: the model's own, with its pruned head counts and head size (Llama -> Mistral when needed)."""
    from transformers import AutoConfig

    fields = copy.deepcopy(model.config.to_dict())
    for key in (*NOT_COPIED, RECORD_ATTR, WIDTHS_ATTR, REMOVED_ATTR):
        fields.pop(key, None)
    fields.update(num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads, head_dim=shape.head_dim)
    fields.update(stock_ffn_width(model))
    model_type = model.config.model_type
    if model_type == "llama" and fields["hidden_size"] % shape.heads:
        if fields.get("attention_bias") or fields.get("mlp_bias"):
            raise ConfigError(
                f"a pruned Llama with {shape.heads} heads of {shape.head_dim} in hidden size {fields['hidden_size']} "
                "is refused by LlamaConfig (hidden size no multiple of the heads), and with attention or MLP biases "
                "it has no stock twin: prune to a head count that divides the hidden size, or use export.format=onnx"
            )
        # LlamaConfig refuses a hidden size its heads do not divide even with head_dim; MistralConfig takes it
        model_type = "mistral"  # same function without biases and without a sliding window
        fields.update(sliding_window=None)
        for key in ("attention_bias", "mlp_bias", "pretraining_tp"):
            fields.pop(key, None)
    config = AutoConfig.for_model(model_type, **fields)
    if model_type == "qwen2":
        config.head_dim = shape.head_dim  # Qwen2Attention reads config.head_dim when present
    return config


def stock_model(model: nn.Module) -> nn.Module:
    """A stock transformers model (built from ``stock_config``) holding the pruned model's weights, loaded strictly."""
    from transformers import AutoModelForCausalLM

    config = stock_config(model, stock_shape(model))
    stock = AutoModelForCausalLM.from_config(config, dtype=next(model.parameters()).dtype)
    missing, unexpected = stock.load_state_dict(model.state_dict(), strict=False)
    missing = [k for k in missing if not (k == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise ValueError(
            f"the pruned weights do not fit the stock {type(stock).__name__}: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    stock.generation_config = copy.deepcopy(model.generation_config)
    return stock.eval()


def export_hf(model: nn.Module, tokenizer, out: Path) -> list[Path]:
    """Write the stock checkpoint (config, safetensors, generation config) and the tokenizer into ``out``; the files written."""
    stock = stock_model(model)
    out.mkdir(parents=True, exist_ok=True)
    stock.save_pretrained(out)
    if tokenizer is not None:
        save_tokenizer(tokenizer, out)
    return sorted(p for p in out.iterdir() if p.is_file())


def check_phantoms(model: nn.Module, emptied: set[int], ffn_free: set[int]) -> None:
    """An emptied layer's remaining (phantom) head or neuron must add exactly nothing, since the file leaves it out."""
    for position, site in enumerate(find_sites(model)):  # position: its index among the layers kept
        if position in emptied and site.linear("output").weight.detach().abs().max() > 0:
            raise ValueError(f"layer {site.layer} has no heads left but its attention output projection is not zero")
    for position, site in enumerate(ffn_sites_if_any(model)):
        if position in ffn_free and site.down().weight.detach().abs().max() > 0:
            raise ValueError(f"layer {site.layer} has no FFN neurons left but its down projection is not zero")


def rope_and_bias_refusal(fields: dict, fmt: str, instead: str) -> str | None:
    """Why ``export.format=<fmt>`` cannot write a Llama model of these config fields, ending with ``use <instead>``; None when it can."""
    rope = fields.get("rope_parameters") or fields.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "linear"):
        return f"export.format={fmt} writes default or linear rotary embeddings only, this model has {rope}: use {instead}"
    if fields.get("attention_bias") or fields.get("mlp_bias"):
        return f"export.format={fmt} writes Llama models without attention or MLP biases: use {instead}"
    return None
