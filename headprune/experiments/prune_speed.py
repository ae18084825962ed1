"""Pruning for speed: targets, recovery and schedules, one Pareto point per (order, recovery, step).

Turned on by any of ``prune.target`` ({speedup: s} | {flops: f} | {max_drop: d}), ``prune.schedule``
(growing fractions or targets: prune, recover, re-score, prune more) or ``prune.recover`` (none | lsq |
finetune, or a list). Without a target or schedule the steps are ``prune.fractions``. Scores come from
``ORDERS`` on the training subset; a target is met by the cost-aware search of ``headprune.selection.mask_search``
(``max_drop`` measured on the selection split, never the evaluation split). Recovery uses
``prune.recover_examples`` training examples of the task's importance subset. ``prune.rearrange`` (true, or
``both`` for points with and without) re-chooses each layer's kept heads of every one-shot mask by the layers'
Fisher blocks, counts kept (``headprune.selection.rearrange``, Kwon et al. 2022). Every point records its
score on the evaluation split, the predicted speed-up and FLOPs kept, and, with ``prune.measure_speed``,
the measured throughput of the physically pruned model (what a Pareto table needs).
"""

from __future__ import annotations

import copy
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import OmegaConf

from headprune.core.gates import HeadGates
from headprune.core.pruning import prune_mask
from headprune.engine.ablation import attention_implementation
from headprune.engine.timing import TimeBudgetError
from headprune.experiments.evaluation import evaluate_many, swapped_model
from headprune.experiments.finetune_runs import budget_info, control_model, finetune_batches, finetune_in_place
from headprune.experiments.orders import ORDERS, OrderSettings, order_scores
from headprune.results.run_dir import mask_to_json
from headprune.scoring.importance import fisher_blocks
from headprune.selection.costs import CostModel, flops_cost_model, kv_group_flops_cost_model
from headprune.selection.greedy import check_groups, heads_removed
from headprune.selection.latency import cached_latency_model, synthetic_inputs
from headprune.selection.lsq import lsq_recover
from headprune.selection.mask_search import PruneTarget, given_target, mask_after
from headprune.selection.rearrange import rearrange_mask
from headprune.selection.schedule import check_schedule, iterative_prune
from headprune.selection.uniform import layout_mask, layout_of, layout_search


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def recoveries_of(settings) -> list[str]:
    """``prune.recover`` as a list (none | lsq | finetune)."""
    given = settings.get("recover") or "none"
    return [str(given)] if isinstance(given, str) else [str(r) for r in given]


def rearrangements_of(settings) -> list[bool]:
    """``prune.rearrange`` as the variants to make: false -> [False], true -> [True], both -> [False, True]."""
    given = settings.get("rearrange", False)
    if given is None or given is False:
        return [False]
    if given is True:
        return [True]
    if given == "both":
        return [False, True]
    raise ValueError(f"prune.rearrange must be false, true or both, got {given!r}")


def for_speed(settings) -> bool:
    """Whether ``prune`` asks for pruning for speed (a target, a schedule, a recovery, a rearrangement, measured speed or extra splits)."""
    return (
        given_target(settings.get("target")) is not None
        or settings.get("schedule") is not None
        or recoveries_of(settings) != ["none"]
        or rearrangements_of(settings) != [False]
        or bool(settings.get("measure_speed"))
        or bool(settings.get("extra_splits"))
    )


def step_label(step) -> str:
    """How a step is written: ``speedup=1.3`` for a target, ``40%`` for a fraction of the heads."""
    return f"{step.kind}={step.value:g}" if isinstance(step, PruneTarget) else f"{100 * step:.0f}%"


def recovery_batches(task, examples: int) -> list[dict]:
    """The first ``examples`` training examples of the task's importance subset, as model-input batches."""
    out, seen = [], 0
    for batch in task.importance_batches():
        size = next(v for v in batch.values() if torch.is_tensor(v)).shape[0]
        keep = min(size, examples - seen)
        out.append(batch if keep == size else {k: v[:keep] if torch.is_tensor(v) and v.dim() else v for k, v in batch.items()})
        seen += keep
        if seen >= examples:
            break
    if not out:
        raise ValueError("recovery needs training examples, but the task's importance subset is empty")
    return out


def flops_model(task, seq_len: int) -> CostModel:
    """Analytic FLOPs with tables in the task's pruning unit (query heads or KV groups)."""
    return kv_group_flops_cost_model(task.model, seq_len) if task.gates.unit == "kv_group" else flops_cost_model(task.model, seq_len)


def cost_model(task, settings, out: Path) -> CostModel:
    """``prune.cost``: analytic FLOPs, or latency tables measured on this machine and cached in ``out/latency``."""
    seq_len = int(settings.get("seq_len", 128))
    if str(settings.get("cost", "flops")) == "flops":
        return flops_model(task, seq_len)
    if task.gates.unit != "head":
        raise ValueError("prune.cost=latency measures tables per query head: use prune.cost=flops with prune.unit=kv_group")
    device = next(task.model.parameters()).device
    inputs = synthetic_inputs(task.model, int(settings.get("latency_batch_size", 1)), seq_len)
    with attention_implementation(task.model, task.gates.inner):  # time the model's own attention, not the gate wrapper
        return cached_latency_model(task.model, inputs, out / "latency", device=device)


def recovered_model(
    task, mask: dict, recovery: str, settings, batches: list[dict], tuning: list[dict] | None = None, logger=False, label: str = "recover"
):
    """(model, gates, mask to evaluate with, fine-tune losses or None) after ``recovery`` of the heads ``mask`` keeps.

    The task's model is untouched. lsq: a copy of the whole model with the least-squares scales folded in, run
    under ``mask`` (equal to the physically pruned copy); finetune: a physically pruned copy fine-tuned on
    ``tuning`` (default ``batches``; mask None), with each step's loss. ``mask`` is in the task's unit (query
    heads or KV groups); the core gets its query-head mask.
    """
    if recovery == "none":
        return task.model, task.gates, mask, None
    model = copy.deepcopy(task.model)
    heads = task.gates.head_mask(mask, hard=True)
    if recovery == "lsq":
        gates = HeadGates(model)
        lsq_recover(model, gates, batches, mask=heads, ridge=float(settings.lsq.ridge), max_scale=float(settings.lsq.max_scale))
        return model, gates, mask, None
    if recovery == "finetune":
        prune_mask(model, heads)
        history = finetune_in_place(model, task.model, tuning or batches, settings.finetune, logger, label)
        return model, HeadGates(model), None, [h["loss"] for h in history]
    raise ValueError(f"unknown recovery {recovery!r}; choose none, lsq or finetune")


@dataclass
class ParetoRun:
    """What every point of one pruning-for-speed run shares: settings, data, costs, and what was computed so far."""

    settings: Any  # the prune block
    order_settings: OrderSettings
    shared: dict  # unmasked order scores, shared by a study's stages
    split: str  # where points are scored
    selection: str  # where a max_drop target is measured
    base: Any  # the unpruned model's EvalResult on split
    groups: list[str]  # the attention groups pruned
    min_per_layer: int
    costs: CostModel  # the cost model the search reads (FLOPs or latency)
    flops: CostModel  # FLOPs, for every point's flops_kept
    batches: list  # recovery batches (lsq; the fine-tune's teacher inputs)
    logger: Any  # Lightning logger or False
    tuning: list | None  # one-shot fine-tune training batches
    rearrange: list[bool]
    layout: str = "global"  # global or uniform (headprune.selection.uniform)
    extra_splits: list[str] = field(default_factory=list)  # more evaluation splits for every point (prune.extra_splits)
    base_extra: dict = field(default_factory=dict)  # split -> the unpruned model's EvalResult there
    rounds: list = field(default_factory=list)  # fine-tune batches of each round (one-shot: one round); the control's too
    models: dict = field(default_factory=dict)  # (recovery, mask key) -> recovered model kept for timing
    evaluated: dict = field(default_factory=dict)  # (recovery, mask key) -> {split: result}, reused across orders
    finetune_losses: dict = field(default_factory=dict)  # label -> fine-tune losses


def rearranged(task, mask: dict, ctx: ParetoRun) -> tuple[dict, dict]:
    """(``mask`` with each layer's kept heads re-chosen by the Fisher blocks of the training subset, what that changed)."""
    if "fisher_blocks" not in ctx.shared:
        ctx.shared["fisher_blocks"] = fisher_blocks(task.model, task.gates, task.importance_batches(), unit=task.gates.unit)
    blocks = ctx.shared["fisher_blocks"]
    done = rearrange_mask(mask, blocks, ctx.groups, ctx.min_per_layer, present=task.gates.present())
    return done.mask, {
        "layers_changed": done.layers_changed,
        "exact": all(all(f) for f in done.exact.values()),
        "fisher_form_before": sum(float(v.sum()) for v in done.before.values()),
        "fisher_form_after": sum(float(v.sum()) for v in done.after.values()),
    }


def step_masks(task, scores, steps, ctx: ParetoRun, rearrange: bool) -> tuple[list[dict], list[dict | None]]:
    """(one mask per step: a target's cost-aware search or a fraction's greedy mask, rearranged or not; rearrangement info)."""
    refine = (lambda m: rearranged(task, m, ctx)[0]) if rearrange else None
    masks = []
    for step in steps:
        if isinstance(step, PruneTarget):
            evaluate = lambda m: task.evaluate(m, split=ctx.selection).score  # noqa: E731
            found = layout_search(ctx.layout)(
                scores,
                ctx.costs,
                step,
                evaluate,
                task.higher_is_better,
                min_per_layer=ctx.min_per_layer,
                groups=ctx.groups,
                refine=refine,
            )  # a max_drop target is checked on rearranged masks
            masks.append(mask_after(found.removed, len(found.removed), ctx.costs.groups))  # the greedy mask, rearranged below
        else:
            masks.append(layout_mask(scores, task.gates.groups, step, ctx.groups, ctx.min_per_layer, ctx.layout))
    if not rearrange:
        return masks, [None] * len(masks)
    return [list(x) for x in zip(*(rearranged(task, m, ctx) for m in masks))] if masks else ([], [])


def eval_splits(ctx: ParetoRun) -> list[str]:
    """The evaluation split, then ``prune.extra_splits``: every point is scored on each."""
    return [ctx.split, *ctx.extra_splits]


def _relative(score: float, base: float) -> float | None:
    return score / base if base else None


def extra_scores(results: dict, ctx: ParetoRun) -> dict:
    """{split: {"score", "relative"}} of a point on each of ``prune.extra_splits`` (relative to the unpruned model there)."""
    return {
        split: {"score": results[split].score, "relative": _relative(results[split].score, ctx.base_extra[split].score)}
        for split in ctx.extra_splits
    }


def _point(order, recovery, step, mask, results: dict, ctx: ParetoRun, task) -> dict:
    """One Pareto point: ``results`` holds its result on every evaluation split (``eval_splits``)."""
    result = results[ctx.split]
    return {
        "order": order,
        "recovery": recovery,
        "step": step_label(step),
        "target": {step.kind: step.value} if isinstance(step, PruneTarget) else None,
        "fraction": None if isinstance(step, PruneTarget) else float(step),
        "heads_pruned": heads_removed(mask),
        "query_heads_pruned": heads_removed(task.gates.head_mask(mask)),
        "heads_total": task.gates.num_heads,
        "score": result.score,
        "relative": _relative(result.score, ctx.base.score),
        **({"extra": extra_scores(results, ctx)} if ctx.extra_splits else {}),
        "predicted_speedup": ctx.costs.speedup(mask),
        "flops_kept": ctx.flops.kept_fraction(mask),
        "cost_unit": ctx.costs.unit,
        "mask": mask_to_json(mask),
    }


def mask_key(mask: dict) -> str:
    """A mask as a hashable key (its JSON form), the same for a tensor mask and its results.json copy."""
    return repr(mask_to_json(mask))


def keep_for_timing(ctx: ParetoRun, key: tuple, model, mask, unit_gates=None) -> None:
    """With ``prune.measure_speed``, keep a recovered model (physically pruned) to time it: generation speed depends on its weights.

    ``mask`` (in the unit of ``unit_gates``, the task's gates) is pruned from the weights first when given.
    """
    if ctx.settings.get("measure_speed"):
        if mask is not None:
            prune_mask(model, unit_gates.head_mask(mask, hard=True))
        ctx.models[key] = model


def recovered_results(task, masks: list[dict], recovery: str, ctx: ParetoRun, labels: list[str]) -> list[dict]:
    """{split: result} on the evaluation splits of every mask after ``recovery``; a mask already evaluated
    (``ctx.evaluated``) is not again.

    A fine-tune's per-step losses go to ``ctx.finetune_losses`` and its logger under each mask's label.
    """
    done = ctx.evaluated
    losses = ctx.finetune_losses
    keys = [(recovery, mask_key(m)) for m in masks]
    todo = {k: (m, label) for k, m, label in zip(keys, masks, labels) if k not in done}
    if recovery == "none":
        if todo:
            masks_to_score = [m for m, _ in todo.values()]
            scored = {
                split: evaluate_many(task, masks_to_score, split, desc=f"one-shot masks ({split})", progress=False)
                for split in eval_splits(ctx)
            }
            done.update((key, {split: scored[split][i] for split in scored}) for i, key in enumerate(todo))
        return [done[k] for k in keys]
    for key, (mask, label) in todo.items():
        model, gates, evaluate_mask, curve = recovered_model(task, mask, recovery, ctx.settings, ctx.batches, ctx.tuning, ctx.logger, label)
        with swapped_model(task, model, gates):
            done[key] = {split: task.evaluate(evaluate_mask, split=split) for split in eval_splits(ctx)}
        if curve is not None:
            losses[key] = curve
        keep_for_timing(ctx, key, model, evaluate_mask, task.gates)
        del model, gates
    return [done[k] for k in keys]


def one_shot_points(task, order, recoveries, steps, ctx: ParetoRun) -> list[dict]:
    """Points of one order pruned once per step (a target or a fraction) from its unmasked scores, rearranged or not, each recovered."""
    scores = order_scores(task, order, ctx.order_settings, ctx.shared)
    points = []
    for rearrange in ctx.rearrange:
        masks, infos = step_masks(task, scores, steps, ctx, rearrange)
        labels = [f"{order}{'+rearrange' if rearrange else ''}/{step_label(step)}" for step in steps]
        for recovery in recoveries:
            results = recovered_results(task, masks, recovery, ctx, labels)
            for step, mask, result, info in zip(steps, masks, results, infos):
                point = _point(order, recovery, step, mask, result, ctx, task)
                curve = ctx.finetune_losses.get((recovery, mask_key(mask)))
                points.append(
                    {
                        **point,
                        "rearranged": rearrange,
                        **({"rearrangement": info} if info else {}),
                        **({"finetune_losses": curve} if curve is not None else {}),
                    }
                )
    return points


def scheduled_points(task, order, recoveries, steps, ctx: ParetoRun) -> list[dict]:
    """Points of one order pruned step by step (``headprune.selection.schedule.iterative_prune``), re-scored and recovered after each step."""
    settings = ctx.settings
    points = []
    for recovery in recoveries:
        work = copy.deepcopy(task.model)

        def scores(model, gates, batches, loss_fn):
            with swapped_model(task, model, gates):
                return ORDERS[order].scores(task, ctx.order_settings)

        def evaluate(mask):  # a max_drop step: the current pruned model under a further mask, on the selection split
            with swapped_model(task, work, HeadGates(work)):
                return task.evaluate(mask, split=ctx.selection).score

        rounds = iter(range(len(steps)))

        def recover(model, teacher, batches):
            round_ = next(rounds)  # which step of the schedule: a fine-tune draws new training examples each round
            if recovery == "lsq":
                lsq_recover(
                    model,
                    HeadGates(model),
                    batches,
                    teacher=teacher,
                    ridge=float(settings.lsq.ridge),
                    max_scale=float(settings.lsq.max_scale),
                )
            elif recovery == "finetune":
                finetune_in_place(model, teacher, ctx.rounds[round_], settings.finetune, ctx.logger, f"{order}/step{round_ + 1}")
            else:
                raise ValueError(f"unknown recovery {recovery!r}; choose none, lsq or finetune")

        done = iterative_prune(
            work,
            steps,
            ctx.batches,
            recover=None if recovery == "none" else recover,
            score_fn=scores,
            min_per_layer=ctx.min_per_layer,
            groups=ctx.groups,
            teacher=task.model,
            costs=ctx.costs,
            evaluate=evaluate,
            unit=task.gates.unit,
            layout=ctx.layout,
        )
        for step, result in zip(steps, done):
            with swapped_model(task, result.model, HeadGates(result.model)):
                scored = {split: task.evaluate(None, split=split) for split in eval_splits(ctx)}
            if recovery != "none":
                keep_for_timing(ctx, (recovery, mask_key(result.mask)), result.model, None)
            points.append(_point(order, recovery, step, result.mask, scored, ctx, task))

    return points


def measure_points(task, points: list[dict], base_point: dict, speed, split: str, seed: int, models: dict | None = None) -> None:
    """Time each distinct physically pruned model against the unpruned one (largest of ``speed.batch_sizes``).

    A recovered point is timed on its own recovered model (``models[(recovery, mask)]``), others on the mask's pruned copy.
    """
    from headprune.experiments.speed import adaptive_settings, clock_of, speed_stage
    from headprune.results.run_dir import mask_from_json

    models = models or {}
    measured: dict[str, dict] = {}
    for point in points:
        own = models.get((point["recovery"], repr(point["mask"])))
        key = repr((point["recovery"], point["mask"])) if own is not None else repr(point["mask"])
        if key not in measured:
            try:
                stage = speed_stage(
                    task,
                    task.gates.normalize_mask(mask_from_json(point["mask"]), hard=True),
                    split,
                    [int(b) for b in speed.batch_sizes],
                    int(speed.examples),
                    int(speed.warmup),
                    int(speed.repeats),
                    seed,
                    False,
                    clock_of(speed),
                    **adaptive_settings(speed),
                    pruned_model=own,
                )
            except TimeBudgetError as error:  # the scores stand: only this point's timing is lost
                print(f"headprune: point not timed, its quality is kept: {error}", file=sys.stderr)
                measured[key] = None
                continue
            if not stage["rows"]:  # the budget cut every timing: the scores stand
                print(f"headprune: point not timed, its quality is kept: {stage['verdict']}", file=sys.stderr)
                measured[key] = None
                continue
            row = stage["rows"][-1]
            measured[key] = {
                "model": "recovered" if own is not None else "pruned by the mask",
                "batch_size": row["batch_size"],
                "examples_per_s": row["pruned"]["examples_per_s"],
                "original_examples_per_s": row["original"]["examples_per_s"],
                "speedup": 1 + row["gain"],
                "verdict": row.get("verdict"),
                "device": stage["device"],
            }
        if measured[key] is not None:
            point["measured"] = measured[key]
    timed = [m for m in measured.values() if m is not None]
    if timed:
        first = timed[0]
        base_point["measured"] = {
            "batch_size": first["batch_size"],
            "examples_per_s": first["original_examples_per_s"],
            "original_examples_per_s": first["original_examples_per_s"],
            "speedup": 1.0,
            "device": first["device"],
        }


def control_point(task, ctx: ParetoRun) -> dict:
    """The unpruned model given the same fine-tune as the pruned points (``prune.control``): "unpruned + same training"."""
    model, losses = control_model(task, ctx.rounds, ctx.settings.finetune, ctx.logger)
    with swapped_model(task, model, HeadGates(model)):
        results = {split: task.evaluate(None, split=split) for split in eval_splits(ctx)}
    del model
    score = results[ctx.split].score
    return {
        "order": "unpruned",
        "recovery": "finetune",
        "control": True,
        "step": "0%",
        "target": None,
        "fraction": 0.0,
        "heads_pruned": 0,
        "query_heads_pruned": 0,
        "heads_total": task.gates.num_heads,
        "score": score,
        "relative": _relative(score, ctx.base.score),
        **({"extra": extra_scores(results, ctx)} if ctx.extra_splits else {}),
        "predicted_speedup": 1.0,
        "flops_kept": 1.0,
        "cost_unit": ctx.costs.unit,
        "finetune_losses": losses,
    }


def pareto_stage(
    task,
    cfg,
    order_settings: OrderSettings,
    orders: list[str],
    fractions: list[float],
    split: str,
    selection: str,
    out: Path,
    base=None,
    shared: dict | None = None,
    logger=False,
) -> dict:
    """Every (order, recovery, step) point and the unpruned one: scores on ``split`` (and ``prune.extra_splits``),
    predicted and measured speed; with ``prune.control`` the unpruned model given the same fine-tune.

    ``logger`` (Lightning, or False) receives every fine-tune recovery step's losses.
    """
    settings = cfg.prune
    target, schedule = given_target(settings.get("target")), settings.get("schedule")
    steps = (
        check_schedule(_plain(schedule))
        if schedule is not None
        else ([PruneTarget.from_config(_plain(target))] if target is not None else [f for f in fractions if f > 0])
    )
    recoveries = recoveries_of(settings)
    control = bool(settings.get("control", False))
    if control and "finetune" not in recoveries:
        raise ValueError("prune.control=true gives the unpruned model the pruned models' fine-tune: add finetune to prune.recover")
    extra = [str(s) for s in settings.get("extra_splits") or []]
    base = base or task.evaluate(None, split=split)
    batches = recovery_batches(task, int(settings.recover_examples)) if schedule is not None or recoveries != ["none"] else []
    rounds = len(steps) if schedule is not None else 1
    tuning_rounds = [finetune_batches(task, settings, batches, r) for r in range(rounds)] if "finetune" in recoveries else []
    ctx = ParetoRun(
        settings=settings,
        order_settings=order_settings,
        shared={} if shared is None else shared,
        split=split,
        selection=selection,
        base=base,
        groups=check_groups(settings.get("groups"), task.gates.groups),
        min_per_layer=int(settings.get("min_heads_per_layer") or 0),
        costs=cost_model(task, settings, out),
        flops=flops_model(task, int(settings.get("seq_len", 128))),
        batches=batches,
        logger=logger,
        tuning=tuning_rounds[0] if tuning_rounds and schedule is None else None,
        rearrange=rearrangements_of(settings),
        layout=layout_of(settings),
        extra_splits=extra,
        base_extra={s: task.evaluate(None, split=s) for s in extra},
        rounds=tuning_rounds,
    )
    if schedule is not None and ctx.rearrange != [False]:
        raise ValueError("prune.rearrange works on one-shot masks (prune.fractions or prune.target), not with prune.schedule")
    make = scheduled_points if schedule is not None else one_shot_points
    points = [p for order in orders for p in make(task, order, recoveries, steps, ctx)]
    unpruned = {
        "order": "unpruned",
        "recovery": "none",
        "step": "0%",
        "target": None,
        "fraction": 0.0,
        "heads_pruned": 0,
        "query_heads_pruned": 0,
        "heads_total": task.gates.num_heads,
        "score": base.score,
        "relative": 1.0,
        **({"extra": {s: {"score": r.score, "relative": 1.0} for s, r in ctx.base_extra.items()}} if extra else {}),
        "predicted_speedup": 1.0,
        "flops_kept": 1.0,
        "cost_unit": ctx.costs.unit,
    }
    controls = [control_point(task, ctx)] if control else []
    if settings.get("measure_speed"):
        measure_points(task, points, unpruned, cfg.speed, str(cfg.speed.split), int(cfg.seed), ctx.models or None)
        for point in controls:  # the unpruned architecture: its timing is the unpruned model's
            if unpruned.get("measured"):
                point["measured"] = dict(unpruned["measured"])
    finetune = {**_plain(settings.finetune), **budget_info(settings.finetune, ctx.rounds)} if "finetune" in recoveries else None
    return {
        "metric": task.metric,
        "higher_is_better": bool(task.higher_is_better),
        "split": split,
        "selection_split": selection,
        "extra_splits": extra,
        "n_examples": base.n,
        "base_score": base.score,
        "groups": ctx.groups,
        "unit": task.gates.unit,
        "layout": ctx.layout,
        "cost": ctx.costs.unit,
        "cost_info": ctx.costs.info or {},
        "schedule": schedule is not None,
        "recover_examples": int(settings.recover_examples),
        "finetune": finetune,
        "control": control,
        "data": task.split_summary(),
        "points": [unpruned, *controls, *points],
    }
