"""Where each family's feed-forward blocks live and which projections hold their neurons (the ``mlp`` of a ``Family`` row)."""

import re
from dataclasses import dataclass


def site(path: str, group: str, *fields: str) -> tuple[str, ...]:
    """A ``sites`` entry: a module path (``*`` for the layer number) matched at the end of a module's path, its group, and
    the entry's other fields."""
    return r"(?:^|\.)" + re.escape(path).replace(r"\*", r"(\d+)") + "$", group, *fields


FFN_GROUPS = ("enc_ffn", "dec_ffn")  # the encoder's and the decoder's feed-forward blocks


@dataclass(frozen=True)
class MLPLayout:
    """How to find and slice the feed-forward blocks of one model family."""

    sites: tuple[tuple[str, str, str], ...]  # (regex on the module path with one (\d+) for the layer, group, config field of its width)
    up: tuple[str, ...]  # paths from that module to the projections whose output rows are the neurons (those it has)
    down: str  # path from that module to the projection whose input columns are the neurons
    blocks: int = 1  # neuron row blocks stacked in each up projection (2: a fused [gate | up] projection)


BERT_MLP = MLPLayout((site("encoder.layer.*", "enc_ffn", "intermediate_size"),), ("intermediate.dense",), "output.dense")

BART_MLP = MLPLayout(  # fc1 / fc2 on the layer itself
    (site("encoder.layers.*", "enc_ffn", "encoder_ffn_dim"), site("decoder.layers.*", "dec_ffn", "decoder_ffn_dim")), ("fc1",), "fc2"
)

GATED_MLP = MLPLayout(  # Llama, Mistral, Qwen, Gemma, Granite, OLMo 2: down(act(gate(x)) * up(x))
    (site("layers.*.mlp", "dec_ffn", "intermediate_size"),), ("gate_proj", "up_proj"), "down_proj"
)

OPT_MLP = MLPLayout((site("decoder.layers.*", "dec_ffn", "ffn_dim"),), ("fc1",), "fc2")

GPT2_MLP = MLPLayout((site("h.*.mlp", "dec_ffn", "n_inner"),), ("c_fc",), "c_proj")  # Conv1D

GPT_NEOX_MLP = MLPLayout((site("layers.*.mlp", "dec_ffn", "intermediate_size"),), ("dense_h_to_4h",), "dense_4h_to_h")

PHI3_MLP = MLPLayout((site("layers.*.mlp", "dec_ffn", "intermediate_size"),), ("gate_up_proj",), "down_proj", blocks=2)

FALCON_MLP = MLPLayout((site("h.*.mlp", "dec_ffn", "ffn_hidden_size"),), ("dense_h_to_4h",), "dense_4h_to_h")

DISTILBERT_MLP = MLPLayout((site("transformer.layer.*.ffn", "enc_ffn", "hidden_dim"),), ("lin1",), "lin2")

VIT_MLP = MLPLayout((site("layers.*.mlp", "enc_ffn", "intermediate_size"),), ("fc1",), "fc2")

T5_MLP = MLPLayout(  # wi (ReLU) or wi_0 / wi_1 (gated GELU: mT5, T5 v1.1), then wo
    (site("encoder.block.*.layer.1.DenseReluDense", "enc_ffn", "d_ff"), site("decoder.block.*.layer.2.DenseReluDense", "dec_ffn", "d_ff")),
    ("wi", "wi_0", "wi_1"),
    "wo",
)
