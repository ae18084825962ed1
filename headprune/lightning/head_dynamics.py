"""Training dynamics of head importance (paper section 6): one snapshot = importance + a pruning curve."""

import math

import torch

from headprune.engine.verdict import prunable_fraction
from headprune.scoring.importance import importance_scores
from headprune.selection.greedy import check_fractions, masks_for_fractions


def take_snapshot(task, fractions, split: str, reduce: str, tolerance: float, epoch: int | None = None, step: int | None = None) -> dict:
    """Importance of every head and the score at each fraction pruned (greedy by that importance)."""
    fractions = check_fractions(fractions)
    if 0.0 not in fractions:
        fractions = [0.0, *fractions]
    model = task.model
    was_training = model.training
    try:
        scores = importance_scores(model, task.gates, task.importance_batches(), reduce=reduce)
        masks = masks_for_fractions(scores, task.gates.groups, fractions)
        results = task.evaluate_many(masks, split=split)
    finally:
        model.train(was_training)
    curve = [float(r.score) for r in results]
    unpruned = curve[0]
    return {
        "epoch": epoch,
        "step": step,
        "metric": results[0].metric,
        "n_eval": results[0].n,
        "fractions": fractions,
        "scores": curve,
        "relative": [s / unpruned if unpruned else float("nan") for s in curve],
        "unpruned": unpruned,
        "prunable_fraction": prunable_fraction(fractions, curve, tolerance, task.higher_is_better),
        "tolerance": tolerance,
        "importance": {g: s.tolist() for g, s in scores.items()},
    }


def spearman(a: dict, b: dict) -> float:
    """Spearman rank correlation between two importance snapshots ({group: [L][H]})."""
    from scipy.stats import spearmanr

    x = torch.cat([torch.as_tensor(a[g]).reshape(-1) for g in sorted(a)])
    y = torch.cat([torch.as_tensor(b[g]).reshape(-1) for g in sorted(b)])
    rho = spearmanr(x.numpy(), y.numpy()).statistic
    return float(rho) if not math.isnan(rho) else 0.0


def with_stability(history: list[dict]) -> list[dict]:
    """Add ``rank_stability`` (Spearman with the previous snapshot) to each snapshot."""
    out = []
    for index, snap in enumerate(history):
        snap = dict(snap)
        snap["rank_stability"] = spearman(history[index - 1]["importance"], snap["importance"]) if index else None
        out.append(snap)
    return out
