"""The keep-one stage (paper section 3.3): per layer, the best single head chosen on a selection split, scored on another."""

from dataclasses import asdict

from headprune.engine.ablation import keep_one_masks
from headprune.measures.evaluation import evaluate_many, evaluate_one, unit_counts
from headprune.results.stream_points import action_record
from headprune.selection.greedy import check_groups


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
        "split": split,
        "n_examples": base.n,
        "base_score": base.score,
        **unit_counts(task.gates, groups),
        **action_record(task),
        "bootstrap": {"n_samples": n_samples, "seed": seed, "alpha": alpha},
        "rows": rows,
    }
