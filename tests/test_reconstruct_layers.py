"""Layer-wise reconstruction after removed layers: their residual update folded into the kept layer below, names followed."""

import copy

import pytest
import torch
from experiment_helpers import make_cfg
from kind_lowrank_plugin import LowRankKind

from headprune.core.inputs import valid_token_rows
from headprune.core.kinds import register_kind, unregister_kind
from headprune.core.kinds.kind_registry import reconstruction_refusal
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.selection.layer_replay import hidden_input, kept_layer_paths, layer_calls, renamed, stacks_of
from headprune.selection.reconstruct import reconstruct, residual_writer, shrunk_projections, teacher_targets
from headprune.stages.calibration_batches import recovery_batches
from headprune.tasks.registry import load_task


def _task(tmp_path_factory, task_name: str, unit: str, *extra: str):
    torch.manual_seed(0)
    return load_task(make_cfg(tmp_path_factory.mktemp("rec"), "prune", task_name, f"prune.unit={unit}", *extra))


def _without_layer(task, layer: int, extra: dict | None = None):
    """A copy of the task's model with one decoder layer (and ``extra`` units) removed."""
    model = copy.deepcopy(task.model)
    gates = unit_gates(model, task.gates.unit)
    mask = {group: torch.ones(shape) for group, shape in gates.groups.items()}
    group = next(g for g in mask if g.endswith("layer"))
    mask[group][layer] = 0.0
    mask.update(extra or {})
    prune_unit_mask(gates, mask)
    return model


def _loss_gap(model, teacher, batches) -> float:
    """Mean squared difference of the final hidden states to the teacher's, over its mean square."""
    num = den = 0.0
    for batch in batches:
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        with torch.no_grad():
            ours = model(**inputs, output_hidden_states=True).hidden_states[-1]
            theirs = teacher(**inputs, output_hidden_states=True).hidden_states[-1]
        num += float(((ours - theirs) ** 2).sum())
        den += float((theirs**2).sum())
    return num / den


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    task = _task(tmp_path_factory, "lm", "[kv_group,ffn,layer]", "model.config.num_hidden_layers=3")
    return task, recovery_batches(task, 32)


def test_kept_layers_keep_their_original_names(llama):
    task, _ = llama
    model = _without_layer(task, 1)
    paths = kept_layer_paths(model, task.model)
    stack = stacks_of(task.model)[0]
    assert paths[stack[0]] == stack[0] and paths[stack[1]] is None and paths[stack[2]] == stack[1]
    assert renamed(stack[2] + ".mlp.down_proj", paths) == stack[1] + ".mlp.down_proj"
    assert renamed(stack[1] + ".mlp.down_proj", paths) is None and renamed("lm_head", paths) == "lm_head"


def test_residual_writer_is_found_where_the_update_is_additive(llama, tmp_path_factory):
    """A pre-norm layer (Llama) writes its stream last through the FFN down projection; a post-norm one (BERT) has none."""
    task, batches = llama
    stack = stacks_of(task.model)[0]
    call = layer_calls(task.model, stack, batches[0])[stack[0]]
    assert residual_writer(task.model, stack[0], call) == stack[0] + ".mlp.down_proj"
    bert = _task(tmp_path_factory, "nli", "layer")
    layers = stacks_of(bert.model)[0]
    call = layer_calls(bert.model, layers, recovery_batches(bert, 8)[0])[layers[0]]
    assert hidden_input(call) is not None and residual_writer(bert.model, layers[0], call) is None


@pytest.mark.parametrize("target", ["inputs", "teacher"])
def test_folding_a_removed_layer_brings_the_output_closer(llama, target):
    """With a middle layer removed, folding its update into the layer below halves (at least) the final-state error."""
    task, batches = llama
    stack = stacks_of(task.model)[0]
    model = _without_layer(task, 1)
    before = _loss_gap(model, task.model, batches)
    report = reconstruct(model, task.model, batches, ridge=1e-3, target=target)
    assert report["layers_folded"] == {stack[1]: stack[0] + ".mlp.down_proj"}
    assert _loss_gap(model, task.model, batches) < 0.5 * before


def test_the_folded_writer_matches_its_target(llama):
    """The re-solved writer's output equals, by least squares, its own output plus the removed layer's update (small ridge)."""
    task, batches = llama
    stack = stacks_of(task.model)[0]
    model = _without_layer(task, 1)
    report = reconstruct(model, task.model, batches, ridge=1e-6, target="inputs")
    name = stack[0] + ".mlp.down_proj"
    assert report["error_after"][name] <= report["error_before"][name]
    # two ways to the same error: the record's, from the normal equations, and one measured on the fitted model
    _, ours = teacher_targets(model, [name], batches)
    num = den = 0.0
    for batch, mine in zip(batches, ours):
        with torch.no_grad():
            hidden = task.model(**{k: v for k, v in batch.items() if k != "labels"}, output_hidden_states=True).hidden_states
        update = valid_token_rows(hidden[2] - hidden[1], batch)  # the removed layer 1's residual update (N, hidden)
        _, theirs = teacher_targets(task.model, [name], [batch])
        want = theirs[0][name] + update
        num += float(((mine[name] - want) ** 2).sum())
        den += float((want**2).sum())
    assert num / den == pytest.approx(report["error_after"][name], rel=1e-2, abs=1e-6)


def test_joint_units_with_layers_are_re_solved_under_their_new_names(llama):
    task, batches = llama
    stack = stacks_of(task.model)[0]
    group = "dec_ffn" if "dec_ffn" in unit_gates(task.model, task.gates.unit).groups else None
    assert group is not None
    layers, width = unit_gates(task.model, task.gates.unit).groups[group]
    ffn = torch.ones(layers, width)
    ffn[:, : width // 2] = 0.0
    model = _without_layer(task, 1, {group: ffn})
    names = shrunk_projections(model, task.model)
    assert stack[0] + ".mlp.down_proj" in names and stack[2] + ".mlp.down_proj" in names
    assert not any(n.startswith(stack[1] + ".") for n in names)
    before = _loss_gap(model, task.model, batches)
    report = reconstruct(model, task.model, batches)
    assert set(names) <= set(report["error_after"]) and _loss_gap(model, task.model, batches) < before


def test_a_kind_without_reconstruction_is_refused_by_name():
    register_kind(LowRankKind())
    try:
        assert "lowrank" in (reconstruction_refusal("lowrank") or "")
    finally:
        unregister_kind("lowrank")
