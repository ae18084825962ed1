"""prune.layout=uniform: every layer of a group loses the same number of units, never more than the fraction asked for."""

from __future__ import annotations

import pytest
import torch
from conftest import classifier_batch, is_uniform, layer_counts, tiny_bert, tiny_marian
from tiny_llms import lm_batch, tiny_llama

from headprune.core.attention.gates import HeadGates
from headprune.selection.costs import flops_cost_model
from headprune.selection.mask_search import search_mask
from headprune.selection.schedule import iterative_prune
from headprune.selection.uniform import layout_mask, layout_masks, layout_search, uniform_counts


def random_scores(shape, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return {g: torch.rand(l, h, generator=generator) for g, (l, h) in shape.items()}


@pytest.mark.parametrize(
    "shape",
    [{"enc_self": (3, 4)}, {"enc_self": (2, 12)}, {"enc_self": (2, 8), "enc_dec": (3, 8), "dec_self": (2, 8)}, {"dec_self": (30, 3)}],
)
def test_uniform_masks_remove_equal_counts_and_never_more_than_the_fraction(shape):
    scores = random_scores(shape)
    fractions = [0.0, 0.1, 0.25, 0.3, 0.34, 0.5, 0.7, 0.9]
    masks = layout_masks(scores, shape, fractions, layout="uniform")
    total = sum(l * h for l, h in shape.values())
    previous = None
    for fraction, mask in zip(fractions, masks):
        assert is_uniform(mask)
        removed = sum(int((m == 0).sum()) for m in mask.values())
        assert removed <= fraction * total + 1e-9
        for group, (layers, heads) in shape.items():
            assert layer_counts(mask)[group] == [int(fraction * heads + 1e-9)] * layers  # floor(f x units) per layer
        if previous is not None:  # nested: a larger fraction removes a superset
            assert all(bool(((previous[g] == 0) <= (mask[g] == 0)).all()) for g in shape)
        previous = mask


def test_uniform_mask_removes_the_lowest_scores_of_each_layer():
    shape = {"enc_self": (3, 5)}
    scores = random_scores(shape, seed=3)
    mask = layout_mask(scores, shape, 0.4, layout="uniform")["enc_self"]
    for layer in range(3):
        lowest = set(scores["enc_self"][layer].argsort()[:2].tolist())
        assert set((mask[layer] == 0).nonzero().flatten().tolist()) == lowest


def test_uniform_counts_keep_the_floor_and_one_unit():
    shape = {"dec_self": (4, 3)}
    assert uniform_counts(0.99, shape, ["dec_self"]) == {"dec_self": 2}  # never an empty layer
    assert uniform_counts(0.99, shape, ["dec_self"], min_per_layer=2) == {"dec_self": 1}


def test_global_layout_is_the_greedy_mask():
    shape = {"enc_self": (3, 4)}
    scores = random_scores(shape, seed=5)
    from headprune.selection.greedy import greedy_mask, n_to_prune, ranked_heads

    for fraction in (0.25, 0.5):
        expected = greedy_mask(ranked_heads(scores, ["enc_self"]), shape, n_to_prune(fraction, shape, ["enc_self"]))
        assert torch.equal(layout_mask(scores, shape, fraction)["enc_self"], expected["enc_self"])


@pytest.mark.parametrize("target", [{"speedup": 1.1}, {"flops": 0.85}])
def test_uniform_target_takes_the_smallest_uniform_count_that_meets_it(target):
    model = tiny_bert(layers=3, heads=4)
    costs = flops_cost_model(model, seq_len=32)
    scores = random_scores(costs.groups, seed=1)
    found = layout_search("uniform")(scores, costs, target)
    assert is_uniform(found.mask)
    k = layer_counts(found.mask)["enc_self"][0]
    meets = (lambda m: costs.speedup(m) >= 1.1) if "speedup" in target else (lambda m: costs.kept_fraction(m) <= 0.85)
    assert meets(found.mask)
    fewer = layout_mask(scores, costs.groups, (k - 1) / 4, layout="uniform") if k > 0 else None
    assert fewer is None or not meets(fewer)  # one unit fewer per layer misses the target
    assert len(found.removed) == 3 * k and found.speedup == pytest.approx(costs.speedup(found.mask))
    # the global search meets the same target removing at most as many heads
    assert len(search_mask(scores, costs, target).removed) <= len(found.removed)


def test_uniform_max_drop_takes_the_largest_count_within_the_drop():
    model = tiny_bert(layers=2, heads=4)
    costs = flops_cost_model(model, seq_len=16)
    scores = random_scores(costs.groups, seed=2)
    evaluate = lambda mask: 100.0 - 3.0 * float((mask["enc_self"] == 0).sum())  # noqa: E731 - 3 points per head removed
    found = layout_search("uniform")(scores, costs, {"max_drop": 13.0}, evaluate=evaluate)
    assert layer_counts(found.mask)["enc_self"] == [2, 2]  # 4 heads = 12 points; 6 heads = 18 > 13


def test_uniform_target_that_cannot_be_met_names_the_layout():
    model = tiny_bert(layers=2, heads=4)
    costs = flops_cost_model(model, seq_len=16)
    with pytest.raises(ValueError, match="uniform layout"):
        layout_search("uniform")(random_scores(costs.groups), costs, {"speedup": 50.0})


@pytest.mark.parametrize("schedule", [[0.25, 0.5], [{"speedup": 1.05}, {"speedup": 1.15}]])
def test_iterative_prune_in_the_uniform_layout_keeps_every_step_uniform(schedule):
    torch.set_num_threads(1)
    model = tiny_bert(layers=3, heads=4)
    costs = flops_cost_model(model, seq_len=16)
    steps = iterative_prune(model, schedule, [classifier_batch()], costs=costs, layout="uniform", keep_models=False)
    for step in steps:
        assert is_uniform(step.mask)
    assert len({len(s.head_ids) for s in HeadGates(model).sites}) == 1  # the pruned model: equal heads in every layer


def test_uniform_kv_groups_of_a_grouped_query_model_stay_a_stock_shape():
    from headprune.core.pruning import prune_mask
    from headprune.core.units import unit_gates

    model = tiny_llama(layers=3, heads=8, kv_heads=4)
    gates = unit_gates(HeadGates(model), "kv_group")
    mask = layout_mask(random_scores(gates.groups), gates.groups, 0.6, layout="uniform")
    prune_mask(model, gates.head_mask(mask, hard=True))
    sites = HeadGates(model).sites
    assert {(len(s.head_ids), len(s.kv_ids)) for s in sites} == {(4, 2)} and all(s.kv_index is None for s in sites)
    with torch.no_grad():
        model(**{k: v for k, v in lm_batch().items() if k != "labels"})


def test_uniform_masks_of_an_encoder_decoder_are_uniform_per_group():
    gates = HeadGates(tiny_marian())
    masks = layout_masks(random_scores(gates.groups), gates.groups, [0.5], groups=["enc_self", "dec_self"], layout="uniform")
    assert layer_counts(masks[0]) == {"enc_self": [2, 2], "enc_dec": [0, 0], "dec_self": [2, 2]}
