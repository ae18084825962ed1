"""A task in a unit that gates FFN neurons: evaluation of its masks (batched and one at a time) equals gating the model by hand."""

from __future__ import annotations

import pytest
import torch
from experiment_helpers import compose_cfg

from headprune.core.units import primitive_gates, unit_gates
from headprune.tasks.unit_task import UnitTask, in_unit

LM = [
    "experiment=inspect",
    "model=tiny_llama",
    "data=lm_synthetic",
    "data.synthetic.sizes.eval=12",
    "data.synthetic.sizes.importance=8",
    "data.synthetic.sizes.heldout=4",
    "data.eval_batch_size=6",
    "logger=none",
]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from headprune.tasks.lm.task import load_lm_task

    return load_lm_task(compose_cfg(tmp_path_factory.mktemp("lm"), LM))


@pytest.mark.parametrize("unit", [["ffn", "kv_group"], "ffn", "block"])
def test_masks_of_a_neuron_unit_evaluate_as_the_model_gated_by_hand(task, unit):
    unit_task = in_unit(task, unit)
    assert isinstance(unit_task, UnitTask) and unit_task.gates.unit == unit_task.unit
    gen = torch.Generator().manual_seed(0)
    masks = [None] + [
        {g: (torch.rand(l, u, generator=gen) < 0.6).float() for g, (l, u) in unit_task.gates.groups.items()} for _ in range(3)
    ]
    batched = unit_task.evaluate_many(masks)
    gates = unit_gates(task.model, unit)
    for mask, result in zip(masks, batched):
        base = gates.base_masks(mask if mask is not None else gates.ones())  # the task gates heads; the neurons by hand
        with primitive_gates(gates)[1].masked(base["ffn"]):
            by_hand = task.evaluate(base.get("head"))
        assert result.score == pytest.approx(by_hand.score, rel=1e-5)
        assert unit_task.evaluate(mask).score == pytest.approx(by_hand.score, rel=1e-5)
    assert task.gates.unit == "head" and all(s.gate is None for s in unit_task.gates.sites)  # the task's own gates are back
    assert abs(batched[1].loss - batched[0].loss) > 1e-5 * batched[0].loss  # the masks change the loss
