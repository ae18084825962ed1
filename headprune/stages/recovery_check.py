"""Does a recovery leave its point worse than the mask alone on the selection split? Each recovered point records both scores."""

import sys

from headprune.measures.evaluation import evaluate_one
from headprune.results.points import point_name
from headprune.stages.own_tokenizer import own_tokenizer_results, renumbers_ids
from headprune.stages.pareto_plan import recoveries_of
from headprune.stages.pareto_points import ParetoRun, eval_splits, mask_key


def scored_splits(ctx: ParetoRun) -> list[str]:
    """The splits every point is scored on: the evaluation splits, and the selection split when a recovery runs."""
    splits = eval_splits(ctx)
    if any(r != "none" for r in recoveries_of(ctx.settings)) and ctx.selection not in splits:
        splits.append(ctx.selection)
    return splits


def recovery_check(results: dict, mask, ctx: ParetoRun, task, label: str) -> dict:
    """A recovered point's score (``results``: {split: result}), its mask alone's on the selection split, and if it got worse."""
    key = mask_key(mask)  # the mask alone: on the base model without recovery, scored once per mask
    if key not in ctx.alone and renumbers_ids(task, mask):  # as it ships: pruned, through its own tokenizer
        alone = own_tokenizer_results(task, task.model, mask, [ctx.selection], f"{label} mask alone", progress=ctx.progress)
        ctx.alone[key] = alone[ctx.selection]
    if key not in ctx.alone:
        ctx.alone[key] = evaluate_one(task, mask, ctx.selection, f"{label} mask alone", progress=ctx.progress)
    recovered, alone = results[ctx.selection], ctx.alone[key]
    worse = recovered.score < alone.score if task.higher_is_better else recovered.score > alone.score
    return {"split": ctx.selection, "metric": task.metric, "recovered": recovered.score, "mask_alone": alone.score, "worse": bool(worse)}


def worse_points(points: list[dict]) -> list[str]:
    """The names of the recovered points whose recovery scored worse than their mask alone on the selection split."""
    return [f"{point_name(p)}@{p['step']}" for p in points if (p.get("recovery_check") or {}).get("worse")]


def say_worse(points: list[dict]) -> None:
    """One line (stderr) per point a recovery made worse: the recovery, the point and both scores on the selection split."""
    for point in points:
        check = point.get("recovery_check") or {}
        if check.get("worse"):
            print(
                f"headprune: warning: the {point['recovery']} recovery made {point_name(point)}@{point['step']} worse than its "
                f"mask alone on the selection split {check['split']}: {check['metric']} {check['recovered']:.4g} against "
                f"{check['mask_alone']:.4g} without recovery",
                file=sys.stderr,
                flush=True,
            )
