"""A chained recovery (``reconstruct+finetune``) equals its steps run one after the other, through the prune experiment."""

from __future__ import annotations

import torch
from experiment_helpers import make_cfg, results, task_fixtures

from headprune.core.units import prune_unit_mask
from headprune.core.units import unit_gates as unit_gates_of
from headprune.experiments import prune
from headprune.settings import RunSettings
from headprune.stages.calibration_batches import recovery_batches
from headprune.stages.finetune_runs import finetune_batches, finetune_in_place
from headprune.stages.pareto_measure import recovered_model
from headprune.tasks.unit_task import in_unit, unit_of

TASK = "lm"
task, shared_task = task_fixtures(TASK)
CHAIN = ["prune.unit=[kv_group,ffn]", "prune.fractions=[0.3]", "prune.recover_examples=16", "prune.finetune.max_steps=2"]


def test_chain_equals_its_steps_in_turn(task, tmp_path):
    cfg = make_cfg(tmp_path, "prune", TASK, *CHAIN, "prune.recover=reconstruct+finetune")
    settings = RunSettings.of(cfg).prune
    unit_task = in_unit(task, unit_of(cfg))
    mask = {name: (torch.arange(m.numel()).reshape(m.shape) % 3 != 0).float() for name, m in unit_task.gates.ones().items()}
    batches = recovery_batches(unit_task, int(settings.recover_examples))
    tuning = finetune_batches(unit_task, settings, batches)
    chained, *_ = recovered_model(unit_task, mask, "reconstruct+finetune", settings, batches, tuning, False, "fisher/30%")
    stepwise, *_ = recovered_model(unit_task, mask, "reconstruct", settings, batches, tuning, False, "fisher/30%")
    alone, *_ = recovered_model(unit_task, mask, "finetune", settings, batches, tuning, False, "fisher/30%")
    finetune_in_place(stepwise, unit_task.model, tuning, settings.finetune, False, "fisher/30%")
    inputs = batches[0]
    with torch.no_grad():
        want, got = stepwise(**inputs).logits, chained(**inputs).logits
        other = alone(**inputs).logits
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-4 * scale
    assert (other - want).abs().max().item() > 1e-3 * scale  # the reconstruction before the fine-tune changed the result
    pruned = unit_task.model.__class__(unit_task.model.config)
    prune_unit_mask(unit_gates_of(pruned, unit_task.gates.unit), mask)  # the chain's model has the pruned shapes
    assert sum(p.numel() for p in chained.parameters()) == sum(p.numel() for p in pruned.parameters())


def test_chain_is_a_point_of_its_own_in_the_experiment(shared_task, tmp_path):
    cfg = make_cfg(tmp_path, "prune", TASK, *CHAIN, "prune.recover=[none,reconstruct,reconstruct+finetune]")
    prune.run(cfg)
    points = results(tmp_path)["results"]["points"]
    assert [p["recovery"] for p in points] == ["none", "none", "reconstruct", "reconstruct+finetune"]
    chained = points[-1]
    assert "reconstruct" in chained and len(chained["finetune_losses"]) == 2
