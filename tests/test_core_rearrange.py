"""Fisher blocks of the gates (diagonal = Fisher scores, one backward = single-example loop) and mask rearrangement."""

import itertools

import pytest
import torch
from conftest import classifier_batch, fisher_blocks, seq2seq_batch, tiny_bert, tiny_marian

from headprune.core.attention.gates import HeadGates
from headprune.scoring.importance import fisher_scores, per_example_gate_gradients
from headprune.selection.rearrange import quadratic_form, rearrange_layer, rearrange_mask, removed_form


def _single(batch, row):
    """Example ``row`` alone, without its padding."""
    length = int(batch["attention_mask"][row].sum())
    return {k: (v[row : row + 1, :length] if k != "labels" else v[row : row + 1]) for k, v in batch.items()}


def _random_blocks(layers: int, heads: int, seed: int) -> torch.Tensor:
    """Random empirical-Fisher-like blocks: mean of g g^T over a few correlated random gradients, (L, H, H)."""
    gen = torch.Generator().manual_seed(seed)
    grads = torch.randn(layers, 6, heads, generator=gen, dtype=torch.float64) @ torch.randn(
        layers, heads, heads, generator=gen, dtype=torch.float64
    )
    return torch.einsum("lbh,lbk->lhk", grads, grads) / 6


def _brute_force(block: torch.Tensor, n_removed: int) -> float:
    """The minimum of (1 - m)^T F (1 - m) over every mask of the layer that removes ``n_removed`` heads."""
    heads = block.shape[0]
    return min(
        removed_form(torch.tensor([float(h in s) for h in range(heads)]), block) for s in itertools.combinations(range(heads), n_removed)
    )


def test_block_diagonals_are_the_fisher_scores():
    model = tiny_marian(dtype=torch.float64)
    gates = HeadGates(model)
    batches = [seq2seq_batch(seed=s) for s in range(2)]
    blocks = fisher_blocks(model, gates, batches)
    scores = fisher_scores(model, gates, batches)
    assert set(blocks) == set(scores) == {"enc_self", "dec_self", "enc_dec"}
    for group, block in blocks.items():
        assert block.shape == (2, 4, 4) and block.dtype == torch.float64
        torch.testing.assert_close(block.diagonal(dim1=1, dim2=2), scores[group].double(), atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(block, block.transpose(1, 2))


def test_blocks_from_one_backward_equal_single_example_loop():
    model = tiny_bert(dtype=torch.float64)
    gates = HeadGates(model)
    batches = [classifier_batch(seed=s) for s in range(2)]
    batched = fisher_blocks(model, gates, batches)["enc_self"]
    singles = [_single(b, r) for b in batches for r in range(4)]
    loop = 0
    for one in singles:
        g = per_example_gate_gradients(model, gates, one)["enc_self"][0]  # (L, H)
        loop = loop + g[:, :, None] * g[:, None, :]
    torch.testing.assert_close(batched, loop / len(singles), atol=1e-6, rtol=1e-5)
    assert bool((batched.diagonal(dim1=1, dim2=2) > 0).all())
    assert float(batched.diagonal(dim1=1, dim2=2).abs().sum()) < float(batched.abs().sum())  # heads of a layer interact


def test_blocks_under_a_mask_zero_the_masked_head():
    model = tiny_bert()
    gates = HeadGates(model)
    mask = gates.ones()
    mask["enc_self"][1, 2] = 0
    block = fisher_blocks(model, gates, [classifier_batch()], mask=mask)["enc_self"]
    assert float(block[1, 2].abs().sum()) == 0 and float(block[1, :, 2].abs().sum()) == 0 and float(block[1, 1, 1]) > 0


@pytest.mark.parametrize("seed", range(4))
def test_rearrangement_is_the_brute_force_optimum_and_keeps_counts(seed):
    blocks = {"enc_self": _random_blocks(4, 6, seed)}
    gen = torch.Generator().manual_seed(seed)
    mask = {"enc_self": torch.ones(4, 6)}
    for layer, n in enumerate([1, 2, 3, 5]):
        mask["enc_self"][layer, torch.randperm(6, generator=gen)[:n]] = 0
    done = rearrange_mask(mask, blocks)
    assert torch.equal(done.mask["enc_self"].sum(1), mask["enc_self"].sum(1))
    assert all(done.exact["enc_self"])
    torch.testing.assert_close(done.before["enc_self"], quadratic_form(mask, blocks)["enc_self"])
    for layer, n in enumerate([1, 2, 3, 5]):
        assert float(done.after["enc_self"][layer]) <= float(done.before["enc_self"][layer])
        assert float(done.after["enc_self"][layer]) == pytest.approx(_brute_force(blocks["enc_self"][layer], n), rel=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_swap_search_never_increases_the_form_and_stops_at_a_swap_local_optimum(seed):
    block = _random_blocks(1, 9, seed)[0]
    gen = torch.Generator().manual_seed(seed)
    row = torch.ones(9)
    row[torch.randperm(9, generator=gen)[:4]] = 0
    swapped, exact = rearrange_layer(row, block, exhaustive_limit=0)
    assert not exact and int(swapped.sum()) == int(row.sum())
    value = removed_form(1 - swapped, block)
    assert value <= removed_form(1 - row, block) + 1e-12
    assert value >= _brute_force(block, 4) - 1e-12
    removed, kept = (swapped == 0).nonzero().flatten().tolist(), (swapped == 1).nonzero().flatten().tolist()
    for i, j in itertools.product(removed, kept):  # no single swap lowers the form
        other = swapped.clone()
        other[i], other[j] = 1.0, 0.0
        assert removed_form(1 - other, block) >= value - 1e-9


def test_diagonal_blocks_leave_the_diagonal_greedy_mask_alone():
    scores = torch.rand(3, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    blocks = {"enc_self": torch.diag_embed(scores)}
    mask = {"enc_self": torch.ones(3, 5)}
    for layer in range(3):
        mask["enc_self"][layer, scores[layer].argsort()[: layer + 1]] = 0  # the lowest diagonal entries go
    for limit in (0, 10_000):
        done = rearrange_mask(mask, blocks, exhaustive_limit=limit)
        assert torch.equal(done.mask["enc_self"], mask["enc_self"]) and done.layers_changed == 0


def test_absent_heads_stay_removed_and_other_groups_are_untouched():
    blocks = {"enc_self": _random_blocks(2, 5, 7), "dec_self": _random_blocks(2, 5, 8)}
    present = {g: torch.ones(2, 5, dtype=torch.bool) for g in blocks}
    present["enc_self"][0, 4] = False
    mask = {g: torch.ones(2, 5) for g in blocks}
    mask["enc_self"][0, [0, 4]] = 0
    mask["enc_self"][1, 1] = 0
    mask["dec_self"][0, 0] = 0
    for limit in (0, 10_000):
        done = rearrange_mask(mask, blocks, groups=["enc_self"], present=present, exhaustive_limit=limit)
        assert float(done.mask["enc_self"][0, 4]) == 0 and torch.equal(done.mask["dec_self"], mask["dec_self"])
        assert set(done.after) == {"enc_self"}
    with pytest.raises(ValueError, match="absent from the model"):
        rearrange_mask({"enc_self": torch.ones(2, 5)}, blocks, groups=["enc_self"], present=present)


def test_bad_blocks_and_floors_are_named():
    mask = {"enc_self": torch.ones(2, 4)}
    mask["enc_self"][0, :3] = 0
    with pytest.raises(ValueError, match="fisher_blocks"):
        rearrange_mask(mask, {"enc_self": torch.zeros(2, 4)})
    with pytest.raises(ValueError, match="min_per_layer=2"):
        rearrange_mask(mask, {"enc_self": torch.zeros(2, 4, 4)}, min_per_layer=2)
