"""A physically pruned model gives the same outputs as the gated model with the same mask."""

import copy

import pytest
import torch
from conftest import classifier_batch, encoder_logits, seq2seq_batch, seq2seq_logits, tiny_bert, tiny_marian

from headprune.core.attention.gates import HeadGates
from headprune.core.counting import model_cost
from headprune.core.masks import head_list
from headprune.core.pruning import prune_heads, prune_mask, pruning_record
from headprune.core.saving import load_pruned, save_pruned


def _random_masks(groups, seed):
    """Random 0/1 masks plus the edge cases: one layer emptied, a whole group emptied."""
    gen = torch.Generator().manual_seed(seed)
    masks = []
    for case in range(4):
        mask = {g: (torch.rand(l, h, generator=gen) > 0.5).float() for g, (l, h) in groups.items()}
        first = next(iter(groups))
        if case == 1:
            mask[first][0] = 0  # a layer with no heads left
        if case == 2:
            mask[list(groups)[-1]][:] = 0  # a whole group emptied
        if case == 3:
            mask = {g: torch.zeros(l, h) for g, (l, h) in groups.items()}  # everything
        masks.append(mask)
    return masks


@pytest.mark.parametrize(
    "make,batch_fn,logits_fn",
    [
        (tiny_bert, classifier_batch, encoder_logits),
        (tiny_marian, seq2seq_batch, seq2seq_logits),
    ],
)
def test_pruned_equals_masked_and_survives_save_load(tmp_path, make, batch_fn, logits_fn):
    model = make()
    gates = HeadGates(model)
    batch = batch_fn()
    for number, mask in enumerate(_random_masks(gates.groups, seed=3)):
        with gates.masked(mask):
            masked = logits_fn(model, batch)
        pruned = copy.deepcopy(model)
        HeadGates(pruned).set_mask(None)
        prune_mask(pruned, mask)
        torch.testing.assert_close(logits_fn(pruned, batch), masked, atol=1e-5, rtol=0)
        save_pruned(pruned, tmp_path / f"m{number}")
        reloaded = load_pruned(tmp_path / f"m{number}")
        torch.testing.assert_close(logits_fn(reloaded, batch), masked, atol=1e-5, rtol=0)


def test_pruned_beam_search_equals_masked():
    model = tiny_marian()
    gates = HeadGates(model)
    src = seq2seq_batch()
    mask = _random_masks(gates.groups, seed=5)[1]
    kwargs = dict(input_ids=src["input_ids"], attention_mask=src["attention_mask"], num_beams=3, max_new_tokens=10)
    with gates.masked(mask):
        masked = model.generate(**kwargs)
    pruned = copy.deepcopy(model)
    prune_mask(pruned, mask)
    HeadGates(pruned).set_mask(None)
    assert torch.equal(pruned.generate(**kwargs), masked)


def test_two_steps_equal_one_and_twice_is_noop():
    model = tiny_bert()
    batch = classifier_batch()
    once, twice = copy.deepcopy(model), copy.deepcopy(model)
    prune_heads(once, {"enc_self": {0: [0, 2, 3], 1: [1], 2: [0, 1, 2, 3]}})
    prune_heads(twice, {"enc_self": {0: [2], 2: [1, 3]}})
    prune_heads(twice, {"enc_self": {0: [0, 3, 2], 1: [1], 2: [0, 2]}})  # head 2 of layer 0 again: a no-op
    assert pruning_record(once) == pruning_record(twice) == {"enc_self": {"0": [0, 2, 3], "1": [1], "2": [0, 1, 2, 3]}}
    torch.testing.assert_close(encoder_logits(once, batch), encoder_logits(twice, batch), atol=1e-6, rtol=0)
    for a, b in zip(once.state_dict().values(), twice.state_dict().values()):
        assert torch.equal(a, b)


def test_costs_fall_with_pruning():
    model = tiny_bert()
    before = model_cost(model, seq_len=32)
    pruned = copy.deepcopy(model)
    prune_heads(pruned, {"enc_self": {0: [0, 1], 1: [2]}})
    after = model_cost(pruned, seq_len=32)
    assert after.heads == before.heads - 3
    head_params = 4 * (32 * 8 + 8) - 8 * 0  # q, k, v rows (weights + bias) and output columns per head
    assert before.parameters - after.parameters == 3 * (3 * (32 * 8 + 8) + 32 * 8)
    assert after.attention_flops < before.attention_flops and head_params > 0


def test_head_list_of_mask():
    mask = {"enc_self": torch.tensor([[1.0, 0.0], [0.0, 0.0]])}
    assert head_list(mask) == {"enc_self": {0: [1], 1: [0, 1]}}
