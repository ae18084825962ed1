"""Pruning for speed: the Pareto search over targets, recoveries and schedules, one point per (order, recovery, step).

Turned on by any of ``prune.target`` ({speedup: s} | {flops: f} | {max_drop: d}), ``prune.schedule``
(growing fractions or targets: prune, recover, re-score, prune more) or ``prune.recover`` (none | lsq |
finetune, or a list). Without a target or schedule the steps are ``prune.fractions``. Scores come from
``ORDERS`` on the training subset; a target is met by the cost-aware search of ``headprune.selection.mask_search``
(``max_drop`` measured on the selection split, never the evaluation split). ``prune.rearrange`` (true, or
``both`` for points with and without) re-chooses each layer's kept heads of every one-shot mask by the layers'
Fisher blocks, counts kept (``headprune.selection.rearrange``, Kwon et al. 2022). Recovery, timing and the
control live in ``headprune.pipeline.pareto_measure``; the point records in ``pareto_points``.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path

from omegaconf import OmegaConf

from headprune.core.gates import HeadGates
from headprune.core.unit_kinds import unit_parts
from headprune.pipeline.evaluation import evaluate_many, swapped_model
from headprune.pipeline.finetune_runs import budget_info, finetune_batches, finetune_in_place
from headprune.pipeline.orders import ORDERS, OrderSettings, order_scores
from headprune.pipeline.pareto_measure import (
    control_point,
    cost_model,
    flops_model,
    keep_for_timing,
    measure_points,
    recovered_model,
    recovery_batches,
)
from headprune.pipeline.pareto_points import ParetoRun, eval_splits, mask_key, point_record, step_label, unpruned_point
from headprune.pipeline.point_models import point_id, recipe_of, save_point_model, saved_dir, saved_model, wants_model
from headprune.pipeline.settings import RunSettings, listed
from headprune.results.run_dir import mask_to_json
from headprune.scoring.importance import fisher_blocks
from headprune.selection.ffn_lsq import unit_lsq_recoverer
from headprune.selection.greedy import check_groups
from headprune.selection.lsq import lsq_recover
from headprune.selection.mask_search import PruneTarget, given_target, mask_after
from headprune.selection.rearrange import rearrange_mask
from headprune.selection.schedule import check_schedule, iterative_prune
from headprune.selection.uniform import layout_mask, layout_search


def _plain(value):
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def recoveries_of(settings) -> list[str]:
    """``prune.recover`` as a list (none | lsq | finetune)."""
    return [str(r) for r in listed(settings.recover)]


def rearrangements_of(settings) -> list[bool]:
    """``prune.rearrange`` as the variants to make: false -> [False], true -> [True], both -> [False, True]."""
    given = settings.rearrange
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
        given_target(settings.target) is not None
        or settings.schedule is not None
        or recoveries_of(settings) != ["none"]
        or rearrangements_of(settings) != [False]
        or bool(settings.measure_speed)
        or bool(settings.extra_splits)
    )


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
        recipe = point_recipe(ctx, label, recovery, mask)
        model = saved_model(ctx.out, recipe) if recipe else None
        if model is not None:  # an earlier run saved this recipe's model: no second recovery
            gates, evaluate_mask, curve = HeadGates(model), None, None
            ctx.saved[key] = saved_dir(recipe)
        else:
            model, gates, evaluate_mask, curve = recovered_model(
                task, mask, recovery, ctx.settings, ctx.batches, ctx.tuning, ctx.logger, label
            )
        with swapped_model(task, model, gates):
            done[key] = {split: task.evaluate(evaluate_mask, split=split) for split in eval_splits(ctx)}
        if curve is not None:
            losses[key] = curve
        if recipe and key not in ctx.saved:
            scores = {split: result.score for split, result in done[key].items()}
            ctx.saved[key] = save_point_model(ctx.out, model, task.gates, evaluate_mask, task.tokenizer, recipe, scores)
        keep_for_timing(ctx, key, model, evaluate_mask, task.gates)
        del model, gates
    return [done[k] for k in keys]


def point_recipe(ctx: ParetoRun, label: str, recovery: str, mask) -> dict | None:
    """The recipe of the point ``label`` (``order[+rearrange]/step``) after ``recovery`` when ``prune.save`` keeps its model."""
    method, step = label.split("/", 1)
    name = method if recovery == "none" else f"{method}+{recovery}"
    point = point_id(name, step)
    if ctx.out is None or not wants_model(ctx.settings.save, recovery, point):
        return None
    return recipe_of(ctx, point, method, recovery, step, mask_to_json(mask))


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
                point = point_record(order, recovery, step, mask, result, ctx, task)
                if (recovery, mask_key(mask)) in ctx.saved:
                    point["model_dir"] = ctx.saved[(recovery, mask_key(mask))]
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
            if recovery == "lsq" and "ffn" in unit_parts(task.gates.unit):  # heads, then neurons, of the pruned model
                unit_lsq_recoverer(task.gates.unit, float(settings.lsq.ridge), float(settings.lsq.max_scale))(model, teacher, batches)
            elif recovery == "lsq":
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
            point = point_record(order, recovery, step, result.mask, scored, ctx, task)
            recipe = point_recipe(ctx, f"{order}/{step_label(step)}", recovery, result.mask)
            if recipe:  # a schedule's models are saved, not reused: each step starts from the one before
                scores = {split: r.score for split, r in scored.items()}
                point["model_dir"] = save_point_model(ctx.out, result.model, task.gates, None, task.tokenizer, recipe, scores)
            points.append(point)

    return points


def pareto_steps(settings, fractions: list[float]) -> list:
    """The steps of every order: ``prune.schedule``, else the one ``prune.target``, else the fractions above 0."""
    target = given_target(settings.target)
    if settings.schedule is not None:
        return check_schedule(_plain(settings.schedule))
    if target is not None:
        return [PruneTarget.from_config(_plain(target))]
    return [f for f in fractions if f > 0]


def pareto_run(task, settings: RunSettings, order_settings: OrderSettings, steps: list, where: dict, out: Path, logger) -> ParetoRun:
    """What every point shares: recovery and fine-tune batches, cost models, the unpruned scores (``where``: split,
    selection, base, shared, seed)."""
    prune = settings.prune
    scheduled, recoveries = prune.schedule is not None, recoveries_of(prune)
    batches = recovery_batches(task, int(prune.recover_examples)) if scheduled or recoveries != ["none"] else []
    count = len(steps) if scheduled else 1
    rounds = [finetune_batches(task, prune, batches, r) for r in range(count)] if "finetune" in recoveries else []
    extra = [str(s) for s in listed(prune.extra_splits)]
    ctx = ParetoRun(
        settings=prune,
        order_settings=order_settings,
        shared=where["shared"],
        split=where["split"],
        selection=where["selection"],
        base=where["base"],
        groups=check_groups(prune.groups, task.gates.groups),
        min_per_layer=int(prune.min_heads_per_layer),
        costs=cost_model(task, prune, out),
        flops=flops_model(task, int(prune.seq_len)),
        batches=batches,
        logger=logger,
        tuning=rounds[0] if rounds and not scheduled else None,
        rearrange=rearrangements_of(prune),
        layout=str(prune.layout),
        extra_splits=extra,
        base_extra={s: task.evaluate(None, split=s) for s in extra},
        rounds=rounds,
        speed=settings.speed,
        seed=where["seed"],
        out=out,
    )
    check_reachable(steps, ctx)
    return ctx


def check_reachable(steps: list, ctx: ParetoRun) -> None:
    """A speedup or flops target that removing every removable head cannot meet is refused before any scoring."""
    import torch

    from headprune.core.checks import ConfigError

    any_order = {group: torch.zeros(shape) for group, shape in ctx.costs.groups.items()}  # the cost at full removal is order-free
    for step in steps:
        if not isinstance(step, PruneTarget) or step.kind == "max_drop":
            continue
        try:
            layout_search(ctx.layout)(any_order, ctx.costs, step, None, True, min_per_layer=ctx.min_per_layer, groups=ctx.groups)
        except ValueError as err:
            flat = " (the latency tables measured here are flat: removing heads saves no measured time; try prune.cost=flops)"
            raise ConfigError(
                f"prune.target / prune.schedule: {err}: choose a target within reach, lower prune.min_heads_per_layer, "
                f"or prune more groups{flat if ctx.costs.unit == 'seconds' else ''}"
            ) from None


def pareto_stage(
    task, settings: RunSettings, order_settings: OrderSettings, orders: list[str], fractions: list[float], where: dict, out: Path, logger
) -> dict:
    """Every (order, recovery, step) point and the unpruned one: scores on ``where["split"]`` (and ``prune.extra_splits``),
    predicted and measured speed; with ``prune.control`` the unpruned model given the same fine-tune.

    ``where``: split, selection, seed, and optionally base (the unpruned EvalResult) and shared (a study's order
    scores). ``logger`` (Lightning, or False) receives every fine-tune recovery step's losses.
    """
    prune = settings.prune
    where = {"base": None, "shared": None, **where}
    where["base"] = where["base"] or task.evaluate(None, split=where["split"])
    where["shared"] = {} if where["shared"] is None else where["shared"]
    steps = pareto_steps(prune, fractions)
    ctx = pareto_run(task, settings, order_settings, steps, where, out, logger)
    make = scheduled_points if prune.schedule is not None else one_shot_points
    points = [p for order in orders for p in make(task, order, recoveries_of(prune), steps, ctx)]
    unpruned = unpruned_point(ctx, task)
    controls = [control_point(task, ctx)] if prune.control else []
    if prune.measure_speed:
        measure_points(task, points, unpruned, ctx)
        for point in controls:  # the unpruned architecture: its timing is the unpruned model's
            if unpruned.get("measured"):
                point["measured"] = dict(unpruned["measured"])
    return pareto_summary(task, ctx, [unpruned, *controls, *points])


def pareto_summary(task, ctx: ParetoRun, points: list[dict]) -> dict:
    """The pareto results: the run's settings and data beside its points."""
    prune = ctx.settings
    finetune = {**asdict(prune.finetune), **budget_info(prune.finetune, ctx.rounds)} if "finetune" in recoveries_of(prune) else None
    return {
        "metric": task.metric,
        "higher_is_better": bool(task.higher_is_better),
        "split": ctx.split,
        "selection_split": ctx.selection,
        "extra_splits": ctx.extra_splits,
        "n_examples": ctx.base.n,
        "base_score": ctx.base.score,
        "groups": ctx.groups,
        "unit": task.gates.unit,
        "layout": ctx.layout,
        "cost": ctx.costs.unit,
        "cost_info": ctx.costs.info or {},
        "schedule": prune.schedule is not None,
        "recover_examples": int(prune.recover_examples),
        "finetune": finetune,
        "control": bool(prune.control),
        "data": task.split_summary(),
        "points": points,
    }
