"""Where each family's feed-forward blocks live and which projections hold their neurons (the ``mlp`` of a ``Family`` row)."""

from dataclasses import dataclass

FFN_GROUPS = ("enc_ffn", "dec_ffn")  # the encoder's and the decoder's feed-forward blocks


@dataclass(frozen=True)
class MLPLayout:
    """How to find and slice the feed-forward blocks of one model family."""

    sites: tuple[tuple[str, str, str], ...]  # (regex on the module path with one (\d+) for the layer, group, config field of its width)
    up: tuple[str, ...]  # paths from that module to the projections whose output rows are the neurons (those it has)
    down: str  # path from that module to the projection whose input columns are the neurons
    blocks: int = 1  # neuron row blocks stacked in each up projection (2: a fused [gate | up] projection)


BERT_MLP = MLPLayout(
    sites=((r"(?:^|\.)encoder\.layer\.(\d+)$", "enc_ffn", "intermediate_size"),), up=("intermediate.dense",), down="output.dense"
)

BART_MLP = MLPLayout(  # fc1 / fc2 on the layer itself
    sites=(
        (r"(?:^|\.)encoder\.layers\.(\d+)$", "enc_ffn", "encoder_ffn_dim"),
        (r"(?:^|\.)decoder\.layers\.(\d+)$", "dec_ffn", "decoder_ffn_dim"),
    ),
    up=("fc1",),
    down="fc2",
)

GATED_MLP = MLPLayout(  # Llama, Mistral, Qwen, Gemma, Granite, OLMo 2: down(act(gate(x)) * up(x))
    sites=((r"(?:^|\.)layers\.(\d+)\.mlp$", "dec_ffn", "intermediate_size"),), up=("gate_proj", "up_proj"), down="down_proj"
)

OPT_MLP = MLPLayout(sites=((r"(?:^|\.)decoder\.layers\.(\d+)$", "dec_ffn", "ffn_dim"),), up=("fc1",), down="fc2")

GPT2_MLP = MLPLayout(sites=((r"(?:^|\.)h\.(\d+)\.mlp$", "dec_ffn", "n_inner"),), up=("c_fc",), down="c_proj")  # Conv1D

GPT_NEOX_MLP = MLPLayout(
    sites=((r"(?:^|\.)layers\.(\d+)\.mlp$", "dec_ffn", "intermediate_size"),), up=("dense_h_to_4h",), down="dense_4h_to_h"
)

PHI3_MLP = MLPLayout(
    sites=((r"(?:^|\.)layers\.(\d+)\.mlp$", "dec_ffn", "intermediate_size"),), up=("gate_up_proj",), down="down_proj", blocks=2
)

FALCON_MLP = MLPLayout(sites=((r"(?:^|\.)h\.(\d+)\.mlp$", "dec_ffn", "ffn_hidden_size"),), up=("dense_h_to_4h",), down="dense_4h_to_h")

DISTILBERT_MLP = MLPLayout(sites=((r"(?:^|\.)transformer\.layer\.(\d+)\.ffn$", "enc_ffn", "hidden_dim"),), up=("lin1",), down="lin2")

VIT_MLP = MLPLayout(sites=((r"(?:^|\.)layers\.(\d+)\.mlp$", "enc_ffn", "intermediate_size"),), up=("fc1",), down="fc2")

T5_MLP = MLPLayout(  # wi (ReLU) or wi_0 / wi_1 (gated GELU: mT5, T5 v1.1), then wo
    sites=(
        (r"(?:^|\.)encoder\.block\.(\d+)\.layer\.1\.DenseReluDense$", "enc_ffn", "d_ff"),
        (r"(?:^|\.)decoder\.block\.(\d+)\.layer\.2\.DenseReluDense$", "dec_ffn", "d_ff"),
    ),
    up=("wi", "wi_0", "wi_1"),
    down="wo",
)
