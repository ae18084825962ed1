"""Layer-wise reconstruction (prune.recover=reconstruct): the solve, masked == pruned, and errors below least squares."""

import copy

import pytest
import torch
from experiment_helpers import make_cfg
from mask_references import pruned_half

from headprune.core.unit_kinds import lsq_refusal
from headprune.core.units import unit_gates
from headprune.selection.lsq import unit_lsq_recoverer
from headprune.selection.reconstruct import reconstruct, shrunk_projections, solve_projection, teacher_targets
from headprune.stages.calibration_batches import recovery_batches
from headprune.tasks.registry import load_task

CASES = [
    ("lm", "[kv_group,ffn]"),
    ("nli", "[head,ffn]"),
    ("lm", "head"),
    ("nli", "ffn"),
    ("lm", "[kv_group,ffn,hidden]"),
    ("nli", "hidden"),
]


@pytest.fixture(scope="module", params=CASES, ids=[f"{t}-{u}" for t, u in CASES])
def pruned(request, tmp_path_factory):
    """(task, the physically pruned copy, the mask, calibration batches) of one tiny task and unit."""
    task_name, unit = request.param
    torch.manual_seed(0)
    task = load_task(make_cfg(tmp_path_factory.mktemp("rec"), "prune", task_name, f"prune.unit={unit}"))
    model, mask = pruned_half(task)
    return task, model, mask, recovery_batches(task, 32)


def _layer_errors(model, teacher, names: dict, batches) -> dict[str, float]:
    """{projection: ||its output - the teacher's at its kept rows||^2 / ||the teacher's||^2} with the model's own inputs."""
    _, ours = teacher_targets(model, list(names), batches)
    _, theirs = teacher_targets(teacher, list(names), batches)
    theirs = [{n: t[n] if names[n] is None else t[n][:, names[n]] for n in names} for t in theirs]  # at the kept rows
    return {n: float(sum(((a[n] - b[n]) ** 2).sum() for a, b in zip(ours, theirs)) / sum((b[n] ** 2).sum() for b in theirs)) for n in names}


def test_solve_equals_a_direct_ridge_least_squares():
    """The normal-equation solve equals lstsq on the stacked system [A; sqrt(lam) I] against [Y; sqrt(lam) W^T]."""
    torch.manual_seed(1)
    x, w = torch.randn(200, 6, dtype=torch.float64), torch.randn(5, 6, dtype=torch.float64)
    y = torch.randn(200, 5, dtype=torch.float64)
    a = torch.cat([x, torch.ones(200, 1, dtype=torch.float64)], 1)
    ridge = 0.3
    solution = solve_projection(a.t() @ a, a.t() @ y, w, True, ridge)
    lam = ridge * float((x * x).sum(0).mean())
    penalty = torch.cat([torch.eye(6, dtype=torch.float64), torch.zeros(6, 1, dtype=torch.float64)], 1) * lam**0.5
    stacked = torch.linalg.lstsq(torch.cat([a, penalty]), torch.cat([y, lam**0.5 * w.t()])).solution.t()
    torch.testing.assert_close(solution, stacked, rtol=1e-9, atol=1e-9)


def test_reconstruct_lowers_every_layer_error(pruned):
    """Every re-solved projection's output error against the teacher is below the mask alone's and below lsq's."""
    task, model, _, batches = pruned
    names = shrunk_projections(model, task.model)
    assert names
    alone = _layer_errors(model, task.model, names, batches)
    fitted = dict(alone)
    if lsq_refusal(task.gates.unit) is None:  # lsq cannot follow removed residual channels
        lsq = copy.deepcopy(model)
        unit_lsq_recoverer(task.gates.unit)(lsq, task.model, batches)
        fitted = _layer_errors(lsq, task.model, names, batches)
    rebuilt = copy.deepcopy(model)
    report = reconstruct(rebuilt, task.model, batches, ridge=1e-3, target="teacher")
    errors = _layer_errors(rebuilt, task.model, names, batches)
    assert report["projections"] == len(names)
    for name in names:
        assert errors[name] <= alone[name] * 1.0001 + 1e-9, (name, errors[name], alone[name])
        assert errors[name] <= fitted[name] * 1.0001 + 1e-9, (name, errors[name], fitted[name])
        # the record's error (from the normal equations) is the one measured
        assert report["error_after"][name] == pytest.approx(errors[name], rel=1e-3, abs=1e-7)


def test_masked_and_pruned_reconstruct_alike(pruned):
    """Reconstructing the masked model (gates at zero) and its physically pruned twin gives the same outputs."""
    task, model, mask, batches = pruned
    names = shrunk_projections(model, task.model)
    rebuilt = copy.deepcopy(model)
    target = reconstruct(rebuilt, task.model, batches)["target"]  # auto: inputs, or teacher where channels went
    masked = copy.deepcopy(task.model)
    gates = unit_gates(masked, task.gates.unit)
    with gates.masked(mask):
        reconstruct(masked, task.model, batches, projections=list(names), target=target)
        batch = batches[0]
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        expected = masked(**inputs).logits
    got = rebuilt(**inputs).logits
    scale = float(expected.abs().max())
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * scale)


def test_too_few_tokens_are_refused(pruned):
    """Fewer calibration tokens than the widest projection's kept inputs: a ValueError naming prune.recover_examples."""
    task, model, _, batches = pruned
    tiny = [{k: v[:1, :2] if torch.is_tensor(v) and v.dim() == 2 else v[:1] if torch.is_tensor(v) else v for k, v in batches[0].items()}]
    with pytest.raises(ValueError, match="prune.recover_examples"):
        reconstruct(copy.deepcopy(model), task.model, tiny)


def test_layer_replay_equals_whole_passes(pruned):
    """Replaying one layer at a time gives the same re-solved model as passes of the whole model up to each projection."""
    task, model, _, batches = pruned
    by_layers, by_passes = copy.deepcopy(model), copy.deepcopy(model)
    first = reconstruct(by_layers, task.model, batches, target="teacher")
    second = reconstruct(by_passes, task.model, batches, by_layers=False, target="teacher")
    assert (first["engine"], second["engine"]) == ("layers", "passes")
    assert first["error_after"].keys() == second["error_after"].keys()
    for (name, a), b in zip(by_layers.named_parameters(), by_passes.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5 * float(b.abs().max()), msg=name)


def test_inputs_target_matches_each_layer_on_its_own_inputs(pruned):
    """target=inputs leaves each projection's error against the unpruned layer on the same inputs at its least squares."""
    task, model, _, batches = pruned
    names = shrunk_projections(model, task.model)
    if model.config.hidden_size != task.model.config.hidden_size:
        with pytest.raises(ValueError, match="target=teacher"):  # the unpruned layers cannot read the narrower stream
            reconstruct(copy.deepcopy(model), task.model, batches, target="inputs")
        return
    rebuilt = copy.deepcopy(model)
    report = reconstruct(rebuilt, task.model, batches, ridge=1e-3, target="inputs")
    assert report["engine"] == "layers" and report["projections"] == len(names)
    assert all(report["error_after"][n] <= report["error_before"][n] * 1.0001 + 1e-9 for n in names)


def test_a_channel_cut_re_solves_the_stream_writers_on_their_kept_rows(pruned):
    """Removed residual channels: every projection that writes the stream is listed with the kept channel ids as its rows."""
    task, model, mask, _ = pruned
    if "hidden" not in mask:
        pytest.skip("no residual channels removed")
    kept = [int(i) for i in mask["hidden"].reshape(-1).nonzero()]
    on_rows = [n for n, rows in shrunk_projections(model, task.model).items() if rows == kept]
    assert len(on_rows) == task.model.config.num_hidden_layers * 2  # attention's output and the FFN's down projection
