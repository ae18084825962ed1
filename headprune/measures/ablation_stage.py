"""Single-unit measures: every head's removal scored on a split (with the figure), and the best single head kept per layer."""

from dataclasses import asdict

import torch

from headprune.engine.ablation import keep_one_masks, single_unit_masks
from headprune.measures.evaluation import evaluate_many, evaluate_one, unit_counts
from headprune.results.run_dir import tensor_dict
from headprune.results.stream_points import action_record
from headprune.selection.greedy import check_groups
from headprune.viz.plots import head_heatmaps


def scored_on(task, split: str, base, groups) -> dict:
    """What both single-unit stages record of the split they score on: its unpruned score, the units and their action."""
    return {"split": split, "n_examples": base.n, "base_score": base.score, **unit_counts(task.gates, groups), **action_record(task)}


def ablation_stage(task, split: str, groups, n_samples: int, seed: int, alpha: float, *, progress: bool, base=None) -> dict:
    """Single-head ablation of every head of ``groups`` on ``split``: deltas, p-values, significance (``alpha`` None: the task's), rows."""
    shape = task.gates.groups
    groups = check_groups(groups, shape)
    masks, heads = single_unit_masks(shape, groups)
    base = base or evaluate_one(task, None, split, "unpruned", progress=progress)
    results = evaluate_many(task, masks, split, desc=f"ablate {split}", progress=progress)
    tests = task.paired_test(base, results, n_samples=n_samples, seed=seed, **({} if alpha is None else {"alpha": alpha}))
    delta = {g: torch.full(shape[g], float("nan")) for g in groups}
    p_value = {g: torch.full(shape[g], float("nan")) for g in groups}
    significant = {g: torch.zeros(shape[g], dtype=torch.bool) for g in groups}
    rows = []
    for (group, layer, head), res, test in zip(heads, results, tests):
        delta[group][layer, head] = test.delta
        p_value[group][layer, head] = test.p_value
        significant[group][layer, head] = test.significant
        rows.append({"group": group, "layer": layer, "head": head, "score": res.score, **asdict(test)})
    per_group = {}
    for group in groups:
        sig, d = significant[group], delta[group]
        per_group[group] = {
            "heads": int(d.numel()),
            "significant": int(sig.sum()),
            "significant_better": int((sig & (d > 0)).sum()),
            "significant_worse": int((sig & (d < 0)).sum()),
            "max_drop": float(-d.min()),
            "max_gain": float(d.max()),
        }
    return {
        "metric": task.metric,
        **scored_on(task, split, base, groups),
        "bootstrap": {"n_samples": n_samples, "seed": seed, "alpha": alpha, "test": task.paired_test_name},
        "per_group": per_group,
        "delta": tensor_dict(delta),
        "p_value": tensor_dict(p_value),
        "significant": {g: s.int().tolist() for g, s in significant.items()},
        "rows": rows,
    }


def ablation_figure(result: dict, path, title: str):
    return head_heatmaps(result["delta"], title, f"{result['metric']} difference", result["significant"], path=path)


def keep_one_stage(task, selection: str, split: str, groups, n_samples: int, seed: int, alpha: float, *, progress: bool, base=None) -> dict:
    """Per layer: the best single head on ``selection``, and the score change on ``split`` with only it kept."""
    shape = task.gates.groups
    groups = check_groups(groups, shape)
    layers = [(g, l) for g in groups for l in range(shape[g][0])]
    candidates = [m for g, l in layers for m in keep_one_masks(shape, g, l)]
    selection_base = evaluate_one(task, None, selection, "unpruned", progress=progress)
    chosen_scores = evaluate_many(task, candidates, selection, desc=f"keep_one select ({selection})", progress=progress)
    best, masks, start = [], [], 0
    for group, layer in layers:
        n_heads = shape[group][1]
        scores = [r.score for r in chosen_scores[start : start + n_heads]]
        head = max(range(n_heads), key=lambda h: (scores[h], -h))
        best.append((group, layer, head, scores))
        masks.append(candidates[start + head])
        start += n_heads
    base = base or evaluate_one(task, None, split, "unpruned", progress=progress)
    results = evaluate_many(task, masks, split, desc=f"keep_one eval ({split})", progress=progress)
    tests = task.paired_test(base, results, n_samples=n_samples, seed=seed, alpha=alpha)
    rows = [
        {
            "group": group,
            "layer": layer,
            "best_head": head,
            "selection_score": scores[head],
            "selection_scores": scores,
            "score": res.score,
            **asdict(test),
        }
        for (group, layer, head, scores), res, test in zip(best, results, tests)
    ]
    return {
        "metric": task.metric,
        "selection_split": selection,
        "selection_base_score": selection_base.score,
        **scored_on(task, split, base, groups),
        "bootstrap": {"n_samples": n_samples, "seed": seed, "alpha": alpha},
        "rows": rows,
    }
