"""prune.reconstruct.tokens=gradient: each calibration token weighs by the loss gradient at the projection's output."""

import copy

import pytest
import torch
from experiment_helpers import make_cfg, results
from mask_references import pruned_half
from torch import nn

from headprune.core.inputs import model_inputs, valid_token_rows
from headprune.core.units import unit_gates
from headprune.experiments import prune
from headprune.scoring.importance import per_example_loss
from headprune.scoring.token_weights import gradient_token_weights
from headprune.selection.reconstruct import fit_projection, reconstruct, shrunk_projections
from headprune.stages.calibration_batches import recovery_batches
from headprune.tasks.registry import load_task

CASES = [("nli", "[head,ffn]"), ("lm", "[kv_group,ffn]")]


@pytest.fixture(scope="module", params=CASES, ids=[f"{t}-{u}" for t, u in CASES])
def pruned(request, tmp_path_factory):
    """(task, the physically pruned copy, its mask, calibration batches) of one tiny task and unit."""
    task_name, unit = request.param
    torch.manual_seed(0)
    task = load_task(make_cfg(tmp_path_factory.mktemp("tok"), "prune", task_name, f"prune.unit={unit}"))
    model, mask = pruned_half(task)
    return task, model, mask, recovery_batches(task, 32)


def _fitted(x: torch.Tensor, y: torch.Tensor, weights, ridge: float = 0.2) -> nn.Linear:
    """A 6 -> 3 projection (fixed start) re-solved on one batch of rows x (N, 6), targets y (N, 3)."""
    torch.manual_seed(3)
    layer = nn.Linear(6, 3).double()
    batch = {"input_ids": torch.zeros(1, x.shape[0], dtype=torch.long)}
    fit_projection(layer, [x.unsqueeze(0)], [batch], [y], None, ridge, weights)
    return layer


def test_a_weight_of_two_equals_the_row_given_twice():
    """Weighting rows by integer counts re-solves the projection as repeating each row that many times does."""
    torch.manual_seed(1)
    x, y = torch.randn(40, 6, dtype=torch.float64), torch.randn(40, 3, dtype=torch.float64)
    counts = torch.randint(1, 4, (40,))
    weighted = _fitted(x, y, [counts.double()])
    repeated = _fitted(x.repeat_interleave(counts, 0), y.repeat_interleave(counts, 0), None)
    scale = float(repeated.weight.abs().max())
    torch.testing.assert_close(weighted.weight, repeated.weight, rtol=0, atol=1e-5 * scale)
    torch.testing.assert_close(weighted.bias, repeated.bias, rtol=0, atol=1e-5 * scale)


def test_weights_of_one_change_nothing():
    """Weights all 1 (the gradient weights' mean) give the uniform fit."""
    torch.manual_seed(2)
    x, y = torch.randn(30, 6, dtype=torch.float64), torch.randn(30, 3, dtype=torch.float64)
    torch.testing.assert_close(_fitted(x, y, [torch.ones(30, dtype=torch.float64)]).weight, _fitted(x, y, None).weight)


def test_gradient_weights_are_the_squared_gradient_norm_with_mean_one(pruned):
    """Each token's weight is ||dL/dy_t||^2 at the projection's output (autograd on the output itself), scaled to mean 1."""
    task, model, _, batches = pruned
    names = shrunk_projections(model, task.model)
    weights = gradient_token_weights(task.model, names, batches)
    name = next(iter(names))
    module, direct = task.model.get_submodule(name), []
    for batch in batches:
        seen = []
        handle = module.register_forward_hook(lambda m, a, out: seen.append(out) or out.retain_grad())
        try:  # a second way: backward into every parameter, the output's gradient retained
            for p in task.model.parameters():
                p.requires_grad_(True)
            per_example_loss(task.model(**model_inputs(task.model, batch)), batch).sum().backward()
        finally:
            handle.remove()
            task.model.zero_grad(set_to_none=True)
        rows = valid_token_rows(seen[0].grad, batch).double()
        direct.append((rows if names[name] is None else rows[:, names[name]]).square().sum(1))
    total = torch.cat(direct)
    got = torch.cat(weights[name])
    assert float(got.mean()) == pytest.approx(1.0, rel=1e-9)
    torch.testing.assert_close(got, total / total.mean(), rtol=1e-4, atol=1e-6)


def test_a_classifier_weighs_only_its_read_token_in_the_last_layer(pruned):
    """A sequence classifier reads the first token of the last layer: every other token's weight there is exactly zero."""
    task, model, _, batches = pruned
    if not hasattr(task.model, "classifier"):
        pytest.skip("a causal LM's loss reads every token")
    names = shrunk_projections(model, task.model)
    last = max(int(n.split(".layer.")[1].split(".")[0]) for n in names)
    name = next(n for n in names if f".layer.{last}." in n and n.endswith("output.dense") and "attention" not in n)
    weights = gradient_token_weights(task.model, {name: names[name]}, batches)[name]
    for batch, w in zip(batches, weights):
        first = torch.zeros_like(batch["attention_mask"])
        first[:, 0] = 1
        read = valid_token_rows(first.unsqueeze(-1), batch).flatten().bool()
        assert bool((w[~read] == 0).all()) and bool((w[read] > 0).any())


def test_gradient_tokens_lower_the_weighted_error_and_keep_masked_equal_pruned(pruned):
    """Reconstruction with gradient weights lowers each projection's weighted error, and the masked model reconstructed
    alike computes what the physically pruned one does."""
    task, model, mask, batches = pruned
    uniform, weighted = copy.deepcopy(model), copy.deepcopy(model)
    first = reconstruct(uniform, task.model, batches, ridge=1e-3, target="teacher")
    second = reconstruct(weighted, task.model, batches, ridge=1e-3, target="teacher", token_weights="gradient")
    assert second["token_weights"] == "gradient" and second["error_after"].keys() == first["error_after"].keys()
    for name in second["error_after"]:
        assert second["error_after"][name] <= second["error_before"][name] * 1.0001 + 1e-9
    names, weighted = shrunk_projections(model, task.model), copy.deepcopy(model)
    reconstruct(weighted, task.model, batches, target="teacher", token_weights="gradient")  # the default ridge
    masked = copy.deepcopy(task.model)
    gates = unit_gates(masked, task.gates.unit)
    with gates.masked(mask):
        reconstruct(masked, task.model, batches, projections=list(names), target="teacher", token_weights="gradient")
        inputs = {k: v for k, v in batches[0].items() if k != "labels"}
        expected = masked(**inputs).logits
    got = weighted(**inputs).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * float(expected.abs().max()))


def test_an_unknown_token_weighting_is_refused(pruned):
    """A token weighting other than uniform or gradient: a ValueError naming the setting, before any work."""
    task, model, _, batches = pruned
    with pytest.raises(ValueError, match="prune.reconstruct.tokens"):
        reconstruct(copy.deepcopy(model), task.model, batches, token_weights="loss")


@pytest.mark.parametrize(("task_name", "unit"), [("nli", "layer"), ("lm", "layer"), ("lm", "[layer,hidden]"), ("nli", "[ffn,layer]")])
def test_gradient_tokens_run_where_only_removed_layers_are_re_solved(tmp_path, task_name, unit):
    """Whole layers removed (their update folded into a writer below, or nowhere): the gradient weighting runs as the
    uniform one does, each reconstructed point written beside the mask alone."""
    overrides = [f"prune.unit={unit}", "prune.joint_scale=loss", "prune.target={flops:0.8}", "prune.recover=[none,reconstruct]"]
    prune.run(make_cfg(tmp_path, "prune", task_name, *overrides, "prune.reconstruct.tokens=gradient", "prune.recover_examples=16"))
    points = results(tmp_path)["results"]["points"]
    assert [p["recovery"] for p in points if p["order"] != "unpruned"][-2:] == ["none", "reconstruct"]
