"""One cost model for every kind and joint unit: a mask's predicted FLOPs equal the physically pruned model's own
``model_cost`` (kinds multiply where they meet), and the target search checks its target with that count."""

from __future__ import annotations

import copy
import itertools

import pytest
import torch
from conftest import tiny_bert
from tiny_llms import tiny_llama

from headprune.core.counting import model_cost
from headprune.core.unit_kinds import unit_kinds
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.selection.mask_search import search_mask
from headprune.selection.unit_costs import unit_flops_cost_model

KINDS = ("head", "kv_group", "ffn", "hidden", "layer", "block")
SEQ = 16


def _allowed(kinds) -> bool:
    try:
        unit_kinds(list(kinds))
    except ValueError:
        return False
    return True


UNITS = [list(c) for r in range(1, len(KINDS) + 1) for c in itertools.combinations(KINDS, r) if _allowed(c)]
MODELS = {"tiny_llama": tiny_llama, "tiny_bert": tiny_bert}
NO_KV_GROUPS = {"tiny_bert"}  # one KV head per query head: no kv_group unit


def _random_mask(model, unit, seed: int = 0) -> dict[str, torch.Tensor]:
    """About 60% of every group kept, each row keeping one unit at least; query heads as many per KV head (GQA)."""
    gates = unit_gates(model, unit)
    gen = torch.Generator().manual_seed(seed)
    mask = {g: (torch.rand(layers, units, generator=gen) < 0.6).float() for g, (layers, units) in gates.groups.items()}
    for rows in mask.values():
        rows[rows.sum(-1) == 0, 0] = 1.0
    if "head" in unit:
        for group, per_kv in unit_gates(model, "head").heads_per_kv.items():
            if per_kv > 1:
                mask[group] = torch.ones_like(mask[group])
                mask[group][:, per_kv - 1 :: per_kv] = 0  # as many query heads left for every KV head
    return mask


@pytest.mark.parametrize("name", list(MODELS))
def test_predicted_flops_equal_the_pruned_models_count(name):
    base = MODELS[name]()
    units = [u for u in UNITS if not (name in NO_KV_GROUPS and "kv_group" in u)]
    assert len(units) >= 10
    for unit in units:
        model = copy.deepcopy(base)
        costs = unit_flops_cost_model(model, unit, SEQ)
        assert costs.total == pytest.approx(model_cost(model, SEQ).flops, rel=1e-9), unit
        mask = _random_mask(model, unit)
        predicted = costs.cost(mask)
        prune_unit_mask(unit_gates(model, unit), mask)
        actual = model_cost(model, SEQ).flops
        assert predicted == pytest.approx(actual, rel=0.01), (unit, predicted, actual, costs.table_cost(mask))


def test_a_joint_flops_target_is_met_by_the_pruned_model():
    """[kv_group, ffn, hidden] at half the FLOPs: the tables alone add the kinds (priced 2.01x, built 1.86x); the search's count is the model's."""
    model = tiny_llama()
    unit = ["kv_group", "ffn", "hidden"]
    costs = unit_flops_cost_model(model, unit, SEQ)
    gen = torch.Generator().manual_seed(0)
    scores = {g: torch.rand(layers, units, generator=gen) for g, (layers, units) in costs.groups.items()}
    found = search_mask(scores, costs, {"flops": 0.5})
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, unit), found.mask)
    kept = model_cost(pruned, SEQ).flops / model_cost(model, SEQ).flops
    assert found.kept_fraction == pytest.approx(kept, rel=1e-9) and kept <= 0.5
    assert costs.table_cost(found.mask) / costs.total < found.kept_fraction  # what adding the tables would have recorded
