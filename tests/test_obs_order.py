"""prune.order=obs: the surgeon's errors equal re-solved least squares, and the order runs on every kind that has columns."""

import pytest
import torch
from experiment_helpers import make_cfg

from headprune.scoring.obs import greedy_surgeon, obs_scores, unit_blocks
from headprune.tasks.registry import load_task


def _resolved_error(x: torch.Tensor, w: torch.Tensor, removed: list[int]) -> float:
    """||X W^T - X_kept W'^T||^2 with W' the least-squares re-solve on the kept columns."""
    kept = [c for c in range(x.shape[1]) if c not in removed]
    y = x @ w.t()
    if not kept:
        return float((y**2).sum())
    solution = torch.linalg.lstsq(x[:, kept], y).solution
    return float(((x[:, kept] @ solution - y) ** 2).sum())


@pytest.mark.parametrize("width", [1, 3])
def test_greedy_errors_add_up_to_the_resolved_error(width):
    """After every greedy removal, the summed errors equal the error of the layer re-solved on the columns left."""
    torch.manual_seed(0)
    units, out = 6, 5
    x = torch.randn(400, units * width, dtype=torch.float64) @ torch.randn(units * width, units * width, dtype=torch.float64)
    w = torch.randn(out, units * width, dtype=torch.float64)
    blocks = [list(range(u * width, (u + 1) * width)) for u in range(units)]
    order = greedy_surgeon(w, x.t() @ x, blocks, damp=1e-12)
    removed, total = [], 0.0
    for unit, cost in order:
        removed += blocks[unit]
        total += cost
        expected = _resolved_error(x, w, removed)
        assert total == pytest.approx(expected, rel=1e-6, abs=1e-8 * float((x @ w.t()).pow(2).sum()))
    # the first pick is the cheapest single removal
    singles = [_resolved_error(x, w, b) for b in blocks]
    assert order[0][1] == pytest.approx(min(singles), rel=1e-6)


@pytest.mark.parametrize(("task_name", "unit"), [("lm", "[kv_group,ffn]"), ("nli", "[head,ffn]")])
def test_obs_scores_cover_every_unit_and_grow_in_greedy_order(tmp_path, task_name, unit):
    """Every unit of every layer gets a score >= 0, and each layer's scores are the running maximum of its greedy path."""
    task = load_task(make_cfg(tmp_path, "prune", task_name, f"prune.unit={unit}", "prune.order=obs", "prune.joint_scale=loss"))
    scores = obs_scores(task.model, task.gates, task.importance_batches(), task.gates.unit)
    assert set(scores) == set(task.gates.groups)
    assert all(bool((s >= 0).all()) and bool((s > 0).any()) for s in scores.values())
    blocks = unit_blocks(task.gates, task.gates.unit)
    assert {(g, layer) for g, layer, *_ in blocks} == {(g, layer) for g, (n, _) in task.gates.groups.items() for layer in range(n)}
