"""Property test: on random tiny configs of every family and random masks, masked == physically pruned."""

import copy

import pytest
import torch
from conftest import classifier_batch, encoder_logits, seq2seq_batch, seq2seq_logits

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from headprune.core.attention.gates import HeadGates  # noqa: E402
from headprune.core.pruning import prune_mask  # noqa: E402

SETTINGS = settings(max_examples=20, deadline=None, derandomize=True, database=None)


def _encoder(kind: str, shape: dict):
    """A random BERT or RoBERTa classifier with ``shape``'s layers, heads and head size."""
    from transformers import BertConfig, BertForSequenceClassification, RobertaConfig, RobertaForSequenceClassification

    config_class, model_class = {
        "bert": (BertConfig, BertForSequenceClassification),
        "roberta": (RobertaConfig, RobertaForSequenceClassification),
    }[kind]
    heads = shape["enc_heads"]
    config = config_class(
        vocab_size=100,
        hidden_size=heads * shape["head_dim"],
        num_hidden_layers=shape["enc_layers"],
        num_attention_heads=heads,
        intermediate_size=16,
        num_labels=3,
        max_position_embeddings=70,
        pad_token_id=1,
    )
    return model_class(config).eval()


def _seq2seq(kind: str, shape: dict):
    """A random BART or Marian model; encoder and decoder may have different head counts and depths."""
    from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel

    config_class, model_class = {"bart": (BartConfig, BartForConditionalGeneration), "marian": (MarianConfig, MarianMTModel)}[kind]
    width = shape["enc_heads"] * shape["dec_heads"] * shape["head_dim"]  # divisible by both head counts
    config = config_class(
        vocab_size=50,
        d_model=width,
        encoder_layers=shape["enc_layers"],
        decoder_layers=shape["dec_layers"],
        encoder_attention_heads=shape["enc_heads"],
        decoder_attention_heads=shape["dec_heads"],
        encoder_ffn_dim=16,
        decoder_ffn_dim=16,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        max_position_embeddings=64,
    )
    return model_class(config).eval()


FAMILIES = {
    "bert": (_encoder, classifier_batch, encoder_logits),
    "roberta": (_encoder, classifier_batch, encoder_logits),
    "bart": (_seq2seq, seq2seq_batch, seq2seq_logits),
    "marian": (_seq2seq, seq2seq_batch, seq2seq_logits),
}

shapes = st.fixed_dictionaries(
    {
        "enc_layers": st.integers(1, 3),
        "dec_layers": st.integers(1, 2),
        "enc_heads": st.integers(1, 4),
        "dec_heads": st.integers(1, 3),
        "head_dim": st.sampled_from([2, 4]),
        "seed": st.integers(0, 2**16),
    }
)


@st.composite
def masks(draw, groups: dict):
    """0/1 masks {group: [layers, heads]}, with whole layers and whole groups emptied (or kept) often."""
    mask = {}
    for group, (layers, heads) in groups.items():
        group_kind = draw(st.sampled_from(["random", "random", "empty", "full"]))
        rows = []
        for _ in range(layers):
            layer_kind = draw(st.sampled_from(["random", "random", "empty"])) if group_kind == "random" else group_kind
            bits = {"empty": [0] * heads, "full": [1] * heads}.get(layer_kind)
            rows.append(bits if bits is not None else draw(st.lists(st.integers(0, 1), min_size=heads, max_size=heads)))
        mask[group] = torch.tensor(rows, dtype=torch.float32)
    return mask


@pytest.mark.parametrize("kind", sorted(FAMILIES))
@SETTINGS
@given(shape=shapes, data=st.data())
def test_masked_equals_pruned_on_random_configs(kind, shape, data):
    build, batch_fn, logits_fn = FAMILIES[kind]
    torch.manual_seed(shape["seed"])
    model = build(kind, shape)
    gates = HeadGates(model)
    mask = data.draw(masks(gates.groups), label="mask")
    batch = batch_fn(seed=shape["seed"])
    with gates.masked(mask):
        masked = logits_fn(model, batch)
    pruned = copy.deepcopy(model)
    prune_mask(pruned, mask)
    torch.testing.assert_close(logits_fn(pruned, batch), masked, atol=1e-5, rtol=0)
    assert all(torch.equal(present, mask[g].bool()) for g, present in HeadGates(pruned).present().items())
