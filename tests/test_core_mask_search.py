"""Cost models and the cost-aware mask search: predictions equal counted FLOPs, targets are met minimally."""

import copy

import pytest
import torch
from conftest import classifier_batch, tiny_bert, tiny_marian

from headprune.core.attention.gates import HeadGates
from headprune.core.counting import model_cost
from headprune.core.pruning import prune_mask
from headprune.scoring.importance import fisher_scores
from headprune.selection.costs import CostModel, flops_cost_model
from headprune.selection.mask_search import PruneTarget, mask_after, removal_order, search_mask


def _pruned_flops(model, mask, seq_len):
    pruned = copy.deepcopy(model)
    prune_mask(pruned, mask)
    return model_cost(pruned, seq_len).flops


@pytest.mark.parametrize("make", [tiny_bert, tiny_marian])
def test_flops_prediction_equals_model_cost_of_pruned_model(make):
    model = make()
    gates = HeadGates(model)
    costs = flops_cost_model(model, seq_len=16)
    assert costs.total == model_cost(model, 16).flops
    gen = torch.Generator().manual_seed(0)
    for _ in range(3):
        mask = {g: (torch.rand(l, h, generator=gen) > 0.5).float() for g, (l, h) in gates.groups.items()}
        mask[next(iter(mask))][0] = 0  # a layer with only its phantom head left
        assert costs.cost(mask) == _pruned_flops(model, mask, 16)


def _fisher(model, gates):
    return fisher_scores(model, gates, [classifier_batch(seed=s) for s in range(2)])


def test_speedup_target_met_by_the_fewest_heads():
    model = tiny_bert()
    gates = HeadGates(model)
    costs = flops_cost_model(model, seq_len=32)
    result = search_mask(_fisher(model, gates), costs, {"speedup": 1.3})
    assert result.speedup >= 1.3
    one_fewer = mask_after(result.removed, len(result.removed) - 1, gates.groups)
    assert costs.speedup(one_fewer) < 1.3
    assert model_cost(model, 32).flops / _pruned_flops(model, result.mask, 32) == pytest.approx(result.speedup)


def test_flops_target_checked_on_the_physically_pruned_model():
    model = tiny_bert()
    gates = HeadGates(model)
    costs = flops_cost_model(model, seq_len=32)
    result = search_mask(_fisher(model, gates), costs, PruneTarget.from_config({"flops": 0.7}), min_per_layer=1)
    full = model_cost(model, 32).flops
    assert _pruned_flops(model, result.mask, 32) / full <= 0.7
    one_fewer = mask_after(result.removed, len(result.removed) - 1, gates.groups)
    assert _pruned_flops(model, one_fewer, 32) / full > 0.7
    assert all(int(row.sum()) >= 1 for row in result.mask["enc_self"])


def test_greedy_takes_low_score_per_cost_first_and_respects_the_start_mask():
    costs = CostModel("flops", 10.0, {"enc_self": torch.tensor([[0, 1, 2, 3], [0, 4, 8, 12]], dtype=torch.float64)})
    scores = {"enc_self": torch.tensor([[1.0, 2.0, 3.0], [2.0, 3.0, 8.0]])}
    # layer 1 heads cost 4 each: 2/4 < 1/1, so layer 1 head 0 goes first, then 3/4 < 1 too
    assert removal_order(scores, costs)[:3] == [("enc_self", 1, 0), ("enc_self", 1, 1), ("enc_self", 0, 0)]
    start = {"enc_self": torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 1.0]])}
    order = removal_order(scores, costs, start=start, min_per_layer=1)
    assert ("enc_self", 1, 0) not in order and len(order) == 3


def test_max_drop_bisection_finds_the_largest_removal_within_the_drop():
    costs = flops_cost_model(tiny_bert(), seq_len=16)
    scores = {"enc_self": torch.arange(12.0).reshape(3, 4)}
    calls = []

    def evaluate(mask):
        calls.append(mask)
        return 80.0 - 0.3 * int((mask["enc_self"] == 0).sum())  # 0.3 points per head removed

    result = search_mask(scores, costs, {"max_drop": 1.0}, evaluate=evaluate)
    assert len(result.removed) == 3 and result.evaluations[0] == 80.0
    assert len(calls) <= 6  # bisection, not a scan


@pytest.mark.parametrize(
    "config,message",
    [
        ({"speedup": 1.0}, "must be > 1"),
        ({"speedup": 0.5}, "must be > 1"),
        ({"flops": 0.0}, r"\(0, 1\)"),
        ({"flops": 1.5}, r"\(0, 1\)"),
        ({"flops": 1.0}, "removes nothing"),
        ({"max_drop": -0.5}, ">= 0"),
        ({"flops": 0.5, "speedup": 1.2}, "exactly one"),
        ({}, "exactly one"),
        ({"latency": 2.0}, "unknown pruning target"),
        ({"speedup": "fast"}, "finite number"),
        ("speedup", "mapping"),
    ],
)
def test_bad_targets_are_clear_errors(config, message):
    with pytest.raises(ValueError, match=message):
        PruneTarget.from_config(config)


def test_unreachable_and_mismatched_targets_are_errors():
    model = tiny_bert()
    costs = flops_cost_model(model, seq_len=8)
    scores = {"enc_self": torch.rand(3, 4)}
    with pytest.raises(ValueError, match="cannot be met"):
        search_mask(scores, costs, {"flops": 0.01})
    with pytest.raises(ValueError, match="needs evaluate"):
        search_mask(scores, costs, {"max_drop": 1.0})
    seconds = CostModel("seconds", 1.0, costs.tables)
    with pytest.raises(ValueError, match="FLOPs cost model"):
        search_mask(scores, seconds, {"flops": 0.9})


def test_latency_tables_are_cached(tmp_path, monkeypatch):
    from headprune.selection import latency

    model = tiny_bert()
    HeadGates(model)
    inputs = latency.synthetic_inputs(model, batch_size=2, seq_len=8)
    first = latency.cached_unit_latency_model(model, inputs, tmp_path, repeats=1, warmup=0)
    assert first.unit == "seconds" and first.tables["enc_self"].shape == (3, 5)
    assert torch.all(first.tables["enc_self"].diff(dim=1) >= 0) and first.tables["enc_self"][:, 0].eq(0).all()
    monkeypatch.setattr(latency, "measure_unit_latency_model", lambda *a, **k: pytest.fail("measured again instead of reading the cache"))
    again = latency.cached_unit_latency_model(model, inputs, tmp_path)
    torch.testing.assert_close(again.tables["enc_self"], first.tables["enc_self"])
    assert again.fixed == pytest.approx(first.fixed) and len(list(tmp_path.glob("latency-*.json"))) == 1
    assert first.fixed >= 0 and first.total >= first.tables["enc_self"][:, -1].sum()


def test_speedup_target_on_a_latency_table():
    tables = {"enc_self": torch.tensor([[0.0, 1.0, 1.5, 2.0, 2.5]] * 3, dtype=torch.float64)}  # the first head costs most
    costs = CostModel("seconds", 4.0, tables)
    scores = {"enc_self": torch.rand(3, 4, generator=torch.Generator().manual_seed(0))}
    result = search_mask(scores, costs, {"speedup": 1.5})
    assert result.speedup >= 1.5 and costs.speedup(mask_after(result.removed, len(result.removed) - 1, costs.groups)) < 1.5
    assert result.cost == pytest.approx(costs.total / result.speedup)
