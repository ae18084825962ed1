"""How the kinds of a joint unit meet under one budget (prune.joint_scale): the relative rule is blind to a constant on one
kind's scores, and the pipeline's joint masks are the selection functions' masks of the comparable scores."""

import pytest
import torch
from tiny_llms import lm_batch, tiny_llama

from headprune.core.units import unit_gates
from headprune.scoring.importance import importance_scores
from headprune.selection.joint_scale import comparable_scores, removable_cost
from headprune.selection.mask_search import search_mask
from headprune.selection.schedule import iterative_prune
from headprune.selection.uniform import layout_mask, layout_search
from headprune.selection.unit_costs import unit_flops_cost_model

SEQ = 16
FACTOR = 1024.0  # a power of two: the scaled scores are the scores times it exactly, so both ways agree to the last bit


def _scored(attention: str):
    model = tiny_llama()
    unit = f"{attention}+ffn"
    gates = unit_gates(model, unit)
    scores = importance_scores(model, gates, [lm_batch(), lm_batch(seed=1)], unit=unit)  # normalised per layer: the default
    return model, unit, gates, scores


def _masks(scores, gates, costs, rule):
    """The masks a flops target (global and uniform layouts) and a fraction choose from ``scores`` under ``rule``."""
    by_cost = comparable_scores(scores, rule, costs)
    return [
        search_mask(by_cost, costs, {"flops": 0.7}).mask,
        layout_search("uniform")(by_cost, costs, {"flops": 0.7}).mask,
        layout_mask(comparable_scores(scores, rule), gates.groups, 0.3),
    ]


@pytest.mark.parametrize("attention", ["head", "kv_group"])
def test_relative_selection_is_blind_to_a_constant_on_one_kind(attention):
    """Every neuron score times 1024: the relative rule's scores and masks are the same, the loss rule's are not."""
    model, unit, gates, scores = _scored(attention)
    scaled = {g: s * FACTOR if g == "dec_ffn" else s for g, s in scores.items()}
    costs = unit_flops_cost_model(model, unit, seq_len=SEQ)
    for budget in (costs, None):
        torch.testing.assert_close(comparable_scores(scaled, "relative", budget), comparable_scores(scores, "relative", budget))
    for plain, times in zip(_masks(scores, gates, costs, "relative"), _masks(scaled, gates, costs, "relative")):
        assert all(torch.equal(plain[g], times[g]) for g in plain)
    loss, loss_scaled = _masks(scores, gates, costs, "loss")[0], _masks(scaled, gates, costs, "loss")[0]
    assert not all(torch.equal(loss[g], loss_scaled[g]) for g in loss)  # the loss rule reads the scale: neurons now kept


def test_relative_scores_have_a_mean_of_one_per_unit_of_cost_in_every_kind():
    model, unit, gates, scores = _scored("kv_group")
    costs = unit_flops_cost_model(model, unit, seq_len=SEQ)
    by_cost, by_count = comparable_scores(scores, "relative", costs), comparable_scores(scores, "relative")
    for group in ("dec_self", "dec_ffn"):
        assert float(by_cost[group].double().sum()) / removable_cost(costs, [group]) == pytest.approx(1.0, rel=1e-6)
        assert float(by_count[group].double().mean()) == pytest.approx(1.0, rel=1e-6)
        ratio = by_cost[group].double() / scores[group].double()  # one positive factor per kind: its own order is kept
        torch.testing.assert_close(ratio, torch.full_like(ratio, float(ratio.flatten()[0])), rtol=1e-5, atol=0)
    assert comparable_scores(scores, "loss", costs) is scores
    ffn_only = {"dec_ffn": scores["dec_ffn"]}
    assert comparable_scores(ffn_only, "relative", costs) is ffn_only  # one kind: nothing to compare


def test_a_schedule_of_targets_ranks_the_kinds_by_the_same_rule():
    """iterative_prune's first step (scores of the unpruned model) is search_mask of the relative scores."""
    model, unit, gates, scores = _scored("kv_group")
    costs = unit_flops_cost_model(model, unit, seq_len=SEQ)
    expected = search_mask(comparable_scores(scores, "relative", costs), costs, {"flops": 0.7}).mask

    def score_fn(model_, gates_, batches, loss_fn):
        return importance_scores(model_, gates_, batches, unit=unit)

    steps = iterative_prune(
        model, [{"flops": 0.7}], [lm_batch(), lm_batch(seed=1)], score_fn=score_fn, costs=costs, unit=unit, joint_scale="relative"
    )
    assert all(torch.equal(steps[0].mask[g], expected[g]) for g in expected)


def test_importance_normalises_each_layer_of_attention_units_only():
    """normalize_layers: each layer's heads (or KV groups) to the norm 1; neurons and blocks keep their raw scores."""
    model, batches = tiny_llama(), [lm_batch(), lm_batch(seed=1)]
    for unit in ("kv_group+ffn", "block"):
        gates = unit_gates(model, unit)
        normed = importance_scores(model, gates, batches, unit=unit)
        raw = importance_scores(model, gates, batches, unit=unit, normalize_layers=False)
        for group in raw:
            if group == "dec_self":
                torch.testing.assert_close(normed[group], raw[group] / raw[group].norm(dim=-1, keepdim=True), rtol=1e-5, atol=1e-8)
            else:
                assert torch.equal(normed[group], raw[group])


def test_a_pruned_model_s_kinds_are_compared_over_the_units_still_there():
    """With ``present``, each kind's mean runs over its present units and the cost they can still remove."""
    model, unit, gates, scores = _scored("kv_group")
    costs = unit_flops_cost_model(model, unit, seq_len=SEQ)
    present = {g: torch.ones(layers, units) for g, (layers, units) in gates.groups.items()}
    present["dec_ffn"][:, 32:] = 0.0  # half of every FFN gone: its neurons score 0
    pruned = {g: s * present[g] for g, s in scores.items()}
    by_cost = comparable_scores(pruned, "relative", costs, present)
    table = costs.tables["dec_ffn"]
    left = float((table[:, 32] - table[:, 0]).sum())  # what the 32 neurons left in each layer can still save
    assert float(by_cost["dec_ffn"].double().sum()) == pytest.approx(left, rel=1e-6)
    assert float(comparable_scores(pruned, "relative", present=present)["dec_ffn"].double().sum()) == pytest.approx(32 * 3, rel=1e-6)
