"""Gates at 1 change nothing; gates at 0 remove heads; per-example masks equal one mask at a time."""

import torch
from conftest import classifier_batch, seq2seq_batch, tiny_bart, tiny_bert, tiny_marian, tiny_roberta

from headprune.core.attention.gates import HeadGates


def _inputs(batch):
    return {k: v for k, v in batch.items() if k != "labels"}


def _seq2seq_inputs(batch):
    labels = batch["labels"].clamp(min=0)
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "decoder_input_ids": labels}


def test_groups_of_each_family():
    assert HeadGates(tiny_bert()).groups == {"enc_self": (3, 4)}
    assert HeadGates(tiny_roberta()).groups == {"enc_self": (2, 4)}
    expected = {"enc_self": (2, 4), "enc_dec": (2, 4), "dec_self": (2, 4)}
    assert HeadGates(tiny_marian()).groups == expected
    assert HeadGates(tiny_bart()).groups == expected


def test_all_ones_equals_plain_model_encoder():
    for make in (tiny_bert, tiny_roberta):
        model = make()
        batch = _inputs(classifier_batch())
        with torch.no_grad():
            plain = model(**batch).logits
            gates = HeadGates(model)
            assert gates.inner == "sdpa"  # the model's own implementation runs underneath
            gates.set_mask(gates.ones())
            gated = model(**batch).logits
        torch.testing.assert_close(gated, plain, atol=1e-6, rtol=0)


def test_all_ones_equals_plain_model_seq2seq():
    for make in (tiny_marian, tiny_bart):
        model = make()
        batch = _seq2seq_inputs(seq2seq_batch())
        with torch.no_grad():
            plain = model(**batch).logits
            gates = HeadGates(model)
            gates.set_mask(gates.ones())
            gated = model(**batch).logits
        torch.testing.assert_close(gated, plain, atol=1e-6, rtol=0)


def test_all_ones_equals_plain_model_minilm(minilm):
    model, tokenizer = minilm
    batch = tokenizer(
        ["A man plays a guitar.", "Nobody is here at all today."],
        ["A person makes music.", "The room is empty."],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        plain = model(**batch).logits
        gates = HeadGates(model)
        gates.set_mask(gates.ones())
        gated = model(**batch).logits
        gates.remove()
    torch.testing.assert_close(gated, plain, atol=1e-6, rtol=0)


def test_beam_search_unchanged_by_unit_gates():
    model = tiny_marian()
    src = seq2seq_batch()
    plain = model.generate(input_ids=src["input_ids"], attention_mask=src["attention_mask"], num_beams=3, max_new_tokens=10)
    gates = HeadGates(model)
    gates.set_mask(gates.ones())
    gated = model.generate(input_ids=src["input_ids"], attention_mask=src["attention_mask"], num_beams=3, max_new_tokens=10)
    assert torch.equal(plain, gated)


def test_per_example_masks_equal_one_mask_at_a_time():
    model = tiny_bert()
    gates = HeadGates(model)
    batch = _inputs(classifier_batch(batch=4))
    masks = (torch.rand(4, 3, 4, generator=torch.Generator().manual_seed(1)) > 0.5).float()
    with torch.no_grad(), gates.masked(masks):
        together = model(**batch).logits
    for row in range(4):
        with torch.no_grad(), gates.masked(masks[row]):
            alone = model(**batch).logits[row]
        torch.testing.assert_close(together[row], alone, atol=1e-6, rtol=0)


def test_zero_gate_changes_output_and_masked_restores():
    model = tiny_bert()
    gates = HeadGates(model)
    batch = _inputs(classifier_batch())
    with torch.no_grad():
        base = model(**batch).logits
        mask = gates.ones()
        mask["enc_self"][1, 2] = 0
        with gates.masked(mask):
            changed = model(**batch).logits
        after = model(**batch).logits
    assert not torch.allclose(base, changed)
    torch.testing.assert_close(after, base, atol=0, rtol=0)
