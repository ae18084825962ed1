"""Pruning for speed: the Pareto search over targets, recoveries and schedules, one point per (order, recovery, step)."""

import copy
from dataclasses import asdict
from pathlib import Path

import torch

from headprune.core.checks import ConfigError
from headprune.core.units import model_gates
from headprune.measures.evaluation import evaluate_one, swapped_model
from headprune.results.run_dir import mask_to_json
from headprune.selection.greedy import check_groups
from headprune.selection.joint_scale import comparable_scores
from headprune.selection.kept_widths import round_kept_widths, round_runtime_multiples, runtime_multiples, width_multiples
from headprune.selection.mask_search import PruneTarget, mask_after
from headprune.selection.schedule import iterative_prune
from headprune.selection.uniform import layout_mask, layout_search
from headprune.selection.unit_costs import unit_bytes_cost_model, unit_flops_cost_model
from headprune.selection.unit_rearrange import example_gradients, rearrange_unit_mask
from headprune.settings import RunSettings, listed
from headprune.sources.orders import ORDERS, OrderSettings, order_scores, with_floor
from headprune.sources.point_models import recipe_of, save_point_model, saved_dir, saved_model, wants_model
from headprune.stages.calibration_batches import recovery_batches
from headprune.stages.finetune_runs import budget_info, finetune_batches
from headprune.stages.own_tokenizer import own_tokenizer_results, renumbers_ids, scored_masks
from headprune.stages.pareto_measure import (
    control_point,
    cost_model,
    keep_for_timing,
    measure_points,
    recovered_model,
    run_recovery,
    shipped_text,
)
from headprune.stages.pareto_plan import pareto_steps, point_label, rearrangements_of, recoveries_of, steps_used
from headprune.stages.pareto_points import ParetoRun, mask_key, point_record, step_label, unpruned_point
from headprune.stages.recovery_check import recovery_check, scored_splits, worse_points


def rearranged(task, mask: dict, ctx: ParetoRun) -> tuple[dict, dict]:
    """(``mask`` with each layer's kept units re-chosen by its kind's rule from the training subset's gate gradients, what that changed)."""
    if "gate_gradients" not in ctx.shared:
        ctx.shared["gate_gradients"] = example_gradients(task.model, task.gates, task.importance_batches(), unit=task.gates.unit)
    grads = ctx.shared["gate_gradients"]
    done = rearrange_unit_mask(mask, grads, task.gates.unit, ctx.groups, ctx.min_per_layer, present=task.gates.present())
    return done.mask, {
        "layers_changed": done.layers_changed,
        "exact": all(all(f) for f in done.exact.values()),
        "fisher_form_before": sum(float(v.sum()) for v in done.before.values()),
        "fisher_form_after": sum(float(v.sum()) for v in done.after.values()),
    }


def step_masks(task, scores, steps, ctx: ParetoRun, rearrange: bool) -> tuple[list[dict], list[dict | None]]:
    """(one mask per step: a target's cost-aware search or a fraction's greedy mask, rearranged or not; rearrangement info)."""
    refine = (lambda m: rearranged(task, m, ctx)[0]) if rearrange else None
    rule = str(ctx.settings.joint_scale)
    ranked = comparable_scores(scores, rule)  # a fraction's ranking, and which removed neurons a rounded width takes back
    masks = []
    for step in steps:
        if isinstance(step, PruneTarget):
            evaluate = lambda m: task.evaluate(m, split=ctx.selection).score  # noqa: E731
            found = layout_search(ctx.layout)(
                comparable_scores(scores, rule, ctx.costs),
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
            masks.append(layout_mask(ranked, task.gates.groups, step, ctx.groups, ctx.min_per_layer, ctx.layout))
    multiples = runtime_multiples(task.gates.unit, ctx.settings)  # the target or fraction is met first, then the tiles
    masks = [round_runtime_multiples(m, ranked, multiples, task.gates.unit) for m in masks]
    widths = width_multiples(task.model, task.gates.unit, ctx.settings)  # one width a stock config takes (the residual stream)
    # a max_drop target bounds the score lost: its widths round up; the other steps bound a cost or a count: down
    up = [isinstance(s, PruneTarget) and s.kind == "max_drop" for s in steps]
    masks = [round_kept_widths(m, ranked, widths, task.gates.unit, up=u) for m, u in zip(masks, up)]
    if not rearrange:
        return masks, [None] * len(masks)
    return [list(x) for x in zip(*(rearranged(task, m, ctx) for m in masks))] if masks else ([], [])


def recovered_results(task, masks: list[dict], recovery: str, ctx: ParetoRun, labels: list[str]) -> list[dict]:
    """{split: result} on the scored splits of every mask after ``recovery`` (each once), saving the points ``prune.save`` keeps."""
    done = ctx.evaluated
    keys = [(recovery, mask_key(m)) for m in masks]
    todo = {k: (m, label) for k, m, label in zip(keys, masks, labels) if k not in done}
    if recovery == "none":
        done.update(masks_alone(task, todo, ctx))
    for key, (mask, label) in todo.items():
        recipe = point_recipe(ctx, label, recovery, mask)
        if recovery == "none":
            model, evaluate_mask = task.model, mask
            if recipe and saved_model(ctx.out, recipe) is not None:  # the same mask alone, saved by an earlier run, loads
                ctx.saved[key] = saved_dir(recipe)
        else:
            model, evaluate_mask = recover_point(task, key, mask, label, recovery, recipe, ctx)
        if recipe and key not in ctx.saved:
            scores = {split: result.score for split, result in done[key].items()}
            ctx.saved[key] = save_point_model(ctx.out, model, task.gates, evaluate_mask, task.tokenizer, recipe, scores)
        if recovery != "none":
            keep_for_timing(ctx, key, model, evaluate_mask, task.gates)
        del model
    return [done[k] for k in keys]


def masks_alone(task, todo: dict, ctx: ParetoRun) -> dict:
    """{key: {split: result}} of the masks of ``todo`` on the base model, batched; the selection-split results go to ``ctx.alone``."""
    out = {key: {} for key in todo}
    for split in scored_splits(ctx):
        known = {k: ctx.alone[mask_key(m)] for k, (m, _) in todo.items() if split == ctx.selection and mask_key(m) in ctx.alone}
        rest = [k for k in todo if k not in known]  # a vocabulary cut's mask through its own tokenizer, the others batched
        scored = scored_masks(task, [todo[k][0] for k in rest], split, f"masks alone ({split})", progress=ctx.progress)
        for key, result in [*known.items(), *zip(rest, scored)]:
            out[key][split] = result
    for key, results in out.items():  # every mask's result alone on the selection split, for the recovered points' checks
        if ctx.selection in results:
            ctx.alone.setdefault(mask_key(todo[key][0]), results[ctx.selection])
    return out


def recover_point(task, key: tuple, mask: dict, label: str, recovery: str, recipe: dict | None, ctx: ParetoRun) -> tuple:
    """(the recovered model, the mask to evaluate it under) of one mask, or an earlier run's saved model; scored into ``ctx.evaluated``."""
    model = saved_model(ctx.out, recipe) if recipe else None
    if model is not None:  # an earlier run saved this recipe's model: no second recovery
        gates, evaluate_mask, record = model_gates(model), None, {}
        ctx.saved[key] = saved_dir(recipe)
    else:
        model, gates, evaluate_mask, record = recovered_model(
            task, mask, recovery, ctx.settings, ctx.batches, ctx.tuning, ctx.logger, label, ctx.progress, ctx.out, ctx.distil_from
        )
    name = point_label(label, recovery)
    lsq = record.get("lsq") or {}
    if lsq.get("shrink") == 0:  # every share of the least squares raised the loss it was checked on
        (most, loss), alone = next(iter(lsq["fit_loss"].items())), lsq["fit_loss"]["0"]
        print(
            f"[prune] {name}: lsq keeps the mask alone: its least squares raised the loss on the batches it was fitted on "
            f"({loss:.4g} with {most} of it, {alone:.4g} without)",
            flush=True,
        )
    ctx.evaluated[key] = scored_model(task, model, gates, evaluate_mask, renumbers_ids(task, mask), name, ctx)
    ctx.recovery_records[key] = record
    return model, evaluate_mask


def scored_model(task, model, gates, mask, renumbers: bool, name: str, ctx: ParetoRun) -> dict:
    """{split: result} of ``model`` under ``mask`` on every scored split; through its own tokenizer where it ``renumbers`` ids."""
    if renumbers:
        return own_tokenizer_results(task, model, mask, scored_splits(ctx), name, progress=ctx.progress)
    with swapped_model(task, model, gates):
        return {split: evaluate_one(task, mask, split, name, progress=ctx.progress) for split in scored_splits(ctx)}


def point_recipe(ctx: ParetoRun, label: str, recovery: str, mask) -> dict | None:
    """The recipe of the point ``label`` (``order[+rearrange]/step``) after ``recovery`` when ``prune.save`` keeps its model."""
    method, step = label.split("/", 1)
    point = point_label(label, recovery)
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
            for step, mask, result, info, label in zip(steps, masks, results, infos, labels):
                key = (recovery, mask_key(mask))
                point = point_record(order, recovery, step, mask, result, ctx, task)
                if recovery != "none":
                    point["recovery_check"] = recovery_check(result, mask, ctx, task, point_label(label, "none"))
                if key in ctx.saved:
                    point["model_dir"] = ctx.saved[key]
                point.update(rearranged=rearrange, **({"rearrangement": info} if info else {}), **ctx.recovery_records.get(key, {}))
                points.append(point)
    return points


def scheduled_points(task, order, recoveries, steps, ctx: ParetoRun) -> list[dict]:
    """Points of one order pruned step by step (``headprune.selection.schedule.iterative_prune``), re-scored and recovered after each step."""
    settings = ctx.settings
    points = []
    for recovery in recoveries:
        work = copy.deepcopy(task.model)

        def scores(model, gates, batches, loss_fn):
            with swapped_model(task, model, gates):  # the kinds' floors (a vocabulary's special tokens) as in one shot
                return with_floor(task, ORDERS[order].scores(task, ctx.order_settings), ctx.order_settings.vocab_text)

        def evaluate(mask):  # a max_drop step: the current pruned model under a further mask, on the selection split
            with swapped_model(task, work):
                return task.evaluate(mask, split=ctx.selection).score

        rounds = iter(range(len(steps)))

        def recover(model, teacher, batches):
            round_ = next(rounds)  # which step of the schedule: a fine-tune draws new training examples each round
            tuning = ctx.rounds[round_] if ctx.rounds else None
            batches, tuning = shipped_text(task, model, recovery, settings, batches, tuning, round_)  # as in one shot
            call = (model, teacher, batches, tuning, f"{order}/step{round_ + 1}")
            run_recovery(recovery, task.gates.unit, settings, ctx.logger, ctx.progress, ctx.out, call)

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
            joint_scale=str(settings.joint_scale),
            widths=width_multiples(task.model, task.gates.unit, settings),
        )
        for step, result in zip(steps, done):
            label = f"{order}/{step_label(step)}"
            name = point_label(label, recovery)
            scored = scored_model(task, result.model, None, None, renumbers_ids(task, result.mask), name, ctx)
            point = point_record(order, recovery, step, result.mask, scored, ctx, task)
            if recovery != "none":
                keep_for_timing(ctx, (recovery, mask_key(result.mask)), result.model, None)
                point["recovery_check"] = recovery_check(scored, result.mask, ctx, task, point_label(label, "none"))
            recipe = point_recipe(ctx, label, recovery, result.mask)
            if recipe:  # a schedule's models are saved, not reused: each step starts from the one before
                scores = {split: r.score for split, r in scored.items()}
                point["model_dir"] = save_point_model(ctx.out, result.model, task.gates, None, task.tokenizer, recipe, scores)
            points.append(point)

    return points


def pareto_run(task, settings: RunSettings, order_settings: OrderSettings, steps: list, where: dict, out: Path, logger) -> ParetoRun:
    """What every point shares: recovery and fine-tune batches, cost models, the unpruned scores."""
    prune = settings.prune
    scheduled, recoveries = prune.schedule is not None, recoveries_of(prune)
    batches = recovery_batches(task, int(prune.recover_examples)) if scheduled or recoveries != ["none"] else []
    count = len(steps) if scheduled else 1
    rounds = [finetune_batches(task, prune, batches, r) for r in range(count)] if "finetune" in steps_used(recoveries) else []
    costs = cost_model(task, prune, out)
    ctx = ParetoRun(
        settings=prune,
        order_settings=order_settings,
        **{key: where[key] for key in ("split", "selection", "seed")},
        shared={} if where.get("shared") is None else where["shared"],
        base=where.get("base"),  # scored below, once the settings are known to work
        groups=check_groups(prune.groups, task.gates.groups),
        min_per_layer=int(prune.min_units_per_layer),
        costs=costs,
        flops=unit_flops_cost_model(task.model, task.gates.unit, int(prune.seq_len)),
        read_bytes=costs if costs.unit == "bytes" else unit_bytes_cost_model(task.model, task.gates.unit),
        batches=batches,
        logger=logger,
        tuning=rounds[0] if rounds and not scheduled else None,
        rearrange=rearrangements_of(prune),
        layout=str(prune.layout),
        extra_splits=[str(s) for s in listed(prune.extra_splits)],
        base_extra={},
        rounds=rounds,
        speed=settings.speed,
        out=out,
        progress=order_settings.progress,
    )
    check_reachable(steps, ctx)
    ctx.base = ctx.base or evaluate_one(task, None, ctx.split, "unpruned", progress=ctx.progress)
    ctx.base_extra = {s: evaluate_one(task, None, s, "unpruned", progress=ctx.progress) for s in ctx.extra_splits}
    return ctx


def check_reachable(steps: list, ctx: ParetoRun) -> None:
    """A speedup, flops or bytes target that removing every removable unit cannot meet is refused before any scoring."""
    any_order = {group: torch.zeros(shape) for group, shape in ctx.costs.groups.items()}  # the cost at full removal is order-free
    for step in steps:
        if not isinstance(step, PruneTarget) or step.kind == "max_drop":
            continue
        try:
            layout_search(ctx.layout)(any_order, ctx.costs, step, None, True, min_per_layer=ctx.min_per_layer, groups=ctx.groups)
        except ValueError as err:
            flat = " (the latency tables measured here are flat: removing heads saves no measured time; try prune.cost=flops)"
            raise ConfigError(
                f"prune.target / prune.schedule: {err}: choose a target within reach, lower prune.min_units_per_layer, "
                f"or prune more groups{flat if ctx.costs.unit == 'seconds' else ''}"
            ) from None


def pareto_stage(
    task, settings: RunSettings, order_settings: OrderSettings, orders: list[str], fractions: list[float], where: dict, out: Path, logger
) -> dict:
    """Every (order, recovery, step) point, the unpruned one and the control (scores, predicted and measured speed), beside the run's settings."""
    prune = settings.prune
    steps = pareto_steps(prune, fractions)
    ctx = pareto_run(task, settings, order_settings, steps, where, out, logger)
    make = scheduled_points if prune.schedule is not None else one_shot_points
    first = prune.control and str(prune.finetune.teacher) == "control"  # the points distil from the control: it trains first
    controls = [control_point(task, ctx)] if first else []
    points = [p for order in orders for p in make(task, order, recoveries_of(prune), steps, ctx)]
    unpruned = unpruned_point(ctx, task)
    controls = controls or ([control_point(task, ctx)] if prune.control else [])
    ctx.distil_from = None
    if prune.measure_speed:
        measure_points(task, points, unpruned, ctx)
        for point in controls:  # the unpruned architecture: its timing is the unpruned model's
            if unpruned.get("measured"):
                point["measured"] = dict(unpruned["measured"])
    finetune = (
        {**asdict(prune.finetune), **budget_info(prune.finetune, ctx.rounds)} if "finetune" in steps_used(recoveries_of(prune)) else None
    )
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
        "recoveries_worse": worse_points(points),  # recovered points scoring worse than their mask alone (selection split)
        "data": task.split_summary(),
        "points": [unpruned, *controls, *points],
    }
