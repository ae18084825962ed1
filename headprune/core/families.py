"""The table of supported model families: where their attention modules and feed-forward blocks live and what they are called."""

import re
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch


# Fused q/k/v projections: where each head's rows sit in the one output of the fused layer.
def concatenated(heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (heads * D) | k (kv_heads * D) | v (kv_heads * D): GPT-2's ``c_attn``, Phi-3's ``qkv_proj``."""
    rows = torch.arange((heads + 2 * kv_heads) * head_dim).view(-1, head_dim)  # (H + 2 KV, D)
    return rows[:heads], rows[heads : heads + kv_heads], rows[heads + kv_heads :]


def grouped(heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per KV head [its query heads | k | v], group after group: Falcon's ``query_key_value``, and GPT-NeoX's (one query head each)."""
    if heads % kv_heads:
        raise ValueError(f"a grouped q/k/v layout needs as many query heads for every KV head, got {heads} over {kv_heads}")
    per_kv = heads // kv_heads
    rows = torch.arange(kv_heads * (per_kv + 2) * head_dim).view(kv_heads, per_kv + 2, head_dim)  # (KV, H / KV + 2, D)
    return rows[:, :per_kv].reshape(heads, head_dim), rows[:, per_kv], rows[:, per_kv + 1]


def site(path: str, group: str, *fields: str) -> tuple[str, ...]:
    """A ``sites`` entry (regex, group, other fields): ``path`` (``*`` for the layer number) matched at the end of a module's path."""
    return r"(?:^|\.)" + re.escape(path).replace(r"\*", r"(\d+)") + "$", group, *fields


FFN_GROUPS = ("enc_ffn", "dec_ffn")  # the encoder's and the decoder's feed-forward blocks


@dataclass(frozen=True)
class MLPLayout:
    """How to find and slice the feed-forward blocks of one model family."""

    sites: tuple[tuple[str, str, str], ...]  # (regex on the module path with one (\d+) for the layer, group, config field of its width)
    up: tuple[str, ...]  # paths from that module to the projections whose output rows are the neurons (those it has)
    down: str  # path from that module to the projection whose input columns are the neurons
    blocks: int = 1  # neuron row blocks stacked in each up projection (2: a fused [gate | up] projection)


def projections(query: str, key: str | None = None, value: str | None = None, output: str = "o_proj") -> dict[str, str]:
    """The paths from the block to the query, key, value and output projections (no key and value: one fused q/k/v projection)."""
    return {"query": query, "key": key or query, "value": value or query, "output": output}


GROUPS = ("enc_self", "enc_dec", "dec_self")
GATE_MECHANISMS = ("attention", "output")  # scale each head's output in the attention function, or at the output projection's input


@dataclass(frozen=True)
class Family:
    """One row of the table: how to find and slice the attention modules of one model family."""

    name: str
    model_types: tuple[str, ...]
    sites: tuple[tuple[str, str], ...]  # (regex on the block's module path with one (\d+) for the layer, group)
    core: str = ""  # path from the block to the module that calls the attention function ("" = the block itself)
    query: str = "q_proj"
    key: str = "k_proj"
    value: str = "v_proj"
    output: str = "o_proj"  # path from the block to the output projection
    head_count_attr: str | None = None  # attribute on the core holding the number of heads (None: query width / head_dim)
    width_attrs: tuple[str, ...] = ()  # attributes on the core holding heads * head_dim
    head_dim_attr: str = "head_dim"
    kv_groups_attr: str | None = None  # grouped KV heads: attribute on the core holding query heads per KV head
    kv_count_attrs: tuple[str, ...] = ()  # attributes on the core holding the number of KV heads
    heads_in_config: bool = False  # the core holds no head count: the model config's config_head_counts[0] does
    config_head_attrs: tuple[str, ...] = ()  # config fields the attention reads for its own head count at run time
    fused_layout: Callable | None = None  # q/k/v one fused projection (query = key = value path): concatenated or grouped above
    cross_head_norms: tuple[str, ...] = ()  # norms on the core over all heads together: pruning cannot be exact
    unprunable_if: tuple[tuple[str, str], ...] = ()  # (model config flag, why) under which pruning cannot be exact
    gate: str = "attention"  # where head gates act: "attention" (the attention-function wrapper) or "output" (attach_output_gate)
    head_rows: tuple[str, ...] = ()  # more projections whose output rows are per head, sliced like the query (when present)
    head_indexed_kwargs: tuple[str, ...] = ()  # attention-function kwargs with a head axis 1 by original id (T5's position bias)
    config_head_counts: tuple[str, ...] = ("num_attention_heads",)  # config fields holding heads per layer
    mlp: MLPLayout | None = None  # its feed-forward blocks (FFN neurons as a unit): MLPLayout above; None: none


BERT_LIKE = Family(
    "bert-like",
    ("bert", "roberta", "xlm-roberta", "camembert", "electra", "ernie", "data2vec-text", "xmod"),
    (site("encoder.layer.*.attention", "enc_self"), site("encoder.layer.*.crossattention", "enc_dec")),
    core="self",
    **projections("self.query", "self.key", "self.value", "output.dense"),
    head_count_attr="num_attention_heads",
    width_attrs=("all_head_size",),
    head_dim_attr="attention_head_size",
    mlp=MLPLayout((site("encoder.layer.*", "enc_ffn", "intermediate_size"),), ("intermediate.dense",), "output.dense"),
)

BART_LIKE = Family(
    "bart/marian-like",
    ("bart", "marian", "mbart", "pegasus", "blenderbot", "blenderbot-small", "plbart"),
    (
        site("encoder.layers.*.self_attn", "enc_self"),
        site("decoder.layers.*.encoder_attn", "enc_dec"),
        site("decoder.layers.*.self_attn", "dec_self"),
    ),
    output="out_proj",
    head_count_attr="num_heads",
    width_attrs=("embed_dim",),
    config_head_counts=("encoder_attention_heads", "decoder_attention_heads"),
    mlp=MLPLayout(  # fc1 / fc2 on the layer itself
        (site("encoder.layers.*", "enc_ffn", "encoder_ffn_dim"), site("decoder.layers.*", "dec_ffn", "decoder_ffn_dim")), ("fc1",), "fc2"
    ),
)

LLAMA_LIKE = Family(
    "llama-like",
    ("llama", "mistral", "qwen2", "qwen3", "granite", "gemma2", "gemma3_text"),
    (site("layers.*.self_attn", "dec_self"),),
    kv_groups_attr="num_key_value_groups",
    mlp=MLPLayout(  # Llama, Mistral, Qwen, Gemma, Granite, OLMo 2: down(act(gate(x)) * up(x))
        (site("layers.*.mlp", "dec_ffn", "intermediate_size"),), ("gate_proj", "up_proj"), "down_proj"
    ),
)

OLMO2 = replace(LLAMA_LIKE, name="olmo2", model_types=("olmo2",), cross_head_norms=("q_norm", "k_norm"))

OPT = Family(
    "opt",
    ("opt",),
    (site("decoder.layers.*.self_attn", "dec_self"),),
    output="out_proj",
    head_count_attr="num_heads",
    mlp=MLPLayout((site("decoder.layers.*", "dec_ffn", "ffn_dim"),), ("fc1",), "fc2"),
)

GPT2 = Family(
    "gpt2",
    ("gpt2",),
    (site("h.*.attn", "dec_self"),),
    **projections("c_attn", output="c_proj"),  # one fused Conv1D: q | k | v
    head_count_attr="num_heads",
    width_attrs=("split_size",),
    fused_layout=concatenated,
    config_head_counts=("n_head",),
    mlp=MLPLayout((site("h.*.mlp", "dec_ffn", "n_inner"),), ("c_fc",), "c_proj"),  # Conv1D
)

GPT_NEOX = Family(
    "gpt-neox",
    ("gpt_neox",),
    (site("layers.*.attention", "dec_self"),),
    **projections("query_key_value", output="dense"),  # fused: per head [q | k | v]
    head_dim_attr="head_size",
    heads_in_config=True,
    fused_layout=grouped,  # one query head per KV head
    mlp=MLPLayout((site("layers.*.mlp", "dec_ffn", "intermediate_size"),), ("dense_h_to_4h",), "dense_4h_to_h"),
)

PHI3 = Family(
    "phi3",
    ("phi3",),
    (site("layers.*.self_attn", "dec_self"),),
    **projections("qkv_proj"),  # fused: q (heads * D) | k (KV * D) | v (KV * D)
    kv_groups_attr="num_key_value_groups",
    kv_count_attrs=("num_key_value_heads",),
    heads_in_config=True,
    config_head_attrs=("num_attention_heads",),  # its forward splits q from k at config.num_attention_heads * D
    fused_layout=concatenated,
    mlp=MLPLayout((site("layers.*.mlp", "dec_ffn", "intermediate_size"),), ("gate_up_proj",), "down_proj", blocks=2),
)

DISTILBERT = Family(
    "distilbert",
    ("distilbert",),
    (site("transformer.layer.*.attention", "enc_self"),),
    **projections("q_lin", "k_lin", "v_lin", "out_lin"),
    head_count_attr="n_heads",
    width_attrs=("dim",),
    head_dim_attr="attention_head_size",
    config_head_counts=("n_heads",),
    mlp=MLPLayout((site("transformer.layer.*.ffn", "enc_ffn", "hidden_dim"),), ("lin1",), "lin2"),
)

VIT_LIKE = Family(
    "vit-like",
    ("vit", "deit"),
    (site("layers.*.attention", "enc_self"),),
    head_count_attr="num_attention_heads",
    mlp=MLPLayout((site("layers.*.mlp", "enc_ffn", "intermediate_size"),), ("fc1",), "fc2"),
)

T5_LIKE = Family(
    "t5",
    ("t5", "mt5"),
    (
        site("encoder.block.*.layer.0.SelfAttention", "enc_self"),
        site("decoder.block.*.layer.1.EncDecAttention", "enc_dec"),
        site("decoder.block.*.layer.0.SelfAttention", "dec_self"),
    ),
    **projections("q", "k", "v", "o"),
    head_count_attr=None,  # n_heads stays the original count: the position bias it sizes is sliced per layer
    width_attrs=("inner_dim",),
    head_dim_attr="key_value_proj_dim",
    head_indexed_kwargs=("position_bias",),  # (1, H, Tq, Tk): made by each stack's first layer for every layer
    config_head_counts=("num_heads",),
    mlp=MLPLayout(  # wi (ReLU) or wi_0 / wi_1 (gated GELU: mT5, T5 v1.1), then wo
        (
            site("encoder.block.*.layer.1.DenseReluDense", "enc_ffn", "d_ff"),
            site("decoder.block.*.layer.2.DenseReluDense", "dec_ffn", "d_ff"),
        ),
        ("wi", "wi_0", "wi_1"),
        "wo",
    ),
)

WHISPER = replace(BART_LIKE, name="whisper", model_types=("whisper",))

DEBERTA_V2 = replace(
    BERT_LIKE,
    name="deberta-v2",
    model_types=("deberta-v2",),
    sites=(site("encoder.layer.*.attention", "enc_self"),),
    query="self.query_proj",
    key="self.key_proj",
    value="self.value_proj",
    gate="output",  # its attention does not call transformers' attention interface
    head_rows=("self.pos_key_proj", "self.pos_query_proj"),  # relative-position projections without share_att_key
)

FALCON = Family(
    "falcon",
    ("falcon",),
    (site("h.*.self_attention", "dec_self"),),
    **projections("query_key_value", output="dense"),  # fused: per KV head [its query heads | k | v]
    head_count_attr="num_heads",
    kv_count_attrs=("num_kv_heads",),
    fused_layout=grouped,
    gate="output",  # its attention does not call transformers' attention interface
    unprunable_if=(("alibi", "its ALiBi slopes are built for the config's head count in every forward"),),
    mlp=MLPLayout((site("h.*.mlp", "dec_ffn", "ffn_hidden_size"),), ("dense_h_to_4h",), "dense_4h_to_h"),
)

FAMILIES: tuple[Family, ...] = (
    BERT_LIKE,
    BART_LIKE,
    LLAMA_LIKE,
    OLMO2,
    OPT,
    GPT2,
    GPT_NEOX,
    PHI3,
    FALCON,
    DISTILBERT,
    VIT_LIKE,
    T5_LIKE,
    WHISPER,
    DEBERTA_V2,
)


def supported_model_types() -> list[str]:
    """All model types that some family of the table covers."""
    return sorted(t for f in FAMILIES for t in f.model_types)


def family_of_type(model_type) -> Family | None:
    """The table row covering a model type (None: no row does)."""
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def config_groups(fields: dict) -> list[str] | None:
    """The attention groups of a model of these config fields (None: not in the table); an encoder's enc_dec only if the config adds it."""
    family = family_of_type(fields.get("model_type"))
    if family is None:
        return None
    groups = list(dict.fromkeys(group for _, group in family.sites))
    no_cross = "dec_self" not in groups and not fields.get("add_cross_attention")
    return [group for group in groups if not (no_cross and group == "enc_dec")]


def family_for(model) -> Family:
    """The table row for a model, or a ValueError that lists the supported model types."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    family = family_of_type(model_type)
    if family is not None:
        return family
    raise ValueError(
        f"headprune does not support model type {model_type!r} "
        f"({type(model).__name__}). Supported model types: {', '.join(supported_model_types())}. "
        "To add a family, add a row to headprune/core/families.py."
    )


def match_site(sites: tuple[tuple, ...], module_path: str) -> tuple | None:
    """(group, layer, *the entry's other fields) when a module path matches an entry (pattern, group, ...) of ``sites``, else None."""
    for pattern, group, *rest in sites:
        found = re.search(pattern, module_path)
        if found:
            return group, int(found.group(1)), *rest
    return None
