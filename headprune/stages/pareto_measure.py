"""Recovery, measurement and the control of pruning for speed: what happens to a point once its mask is chosen."""

import copy
import dataclasses
import sys
from pathlib import Path

from headprune.core.attention.gates import own_attention_name
from headprune.core.unit_kinds import lsq_refits_heads_alone
from headprune.core.units import model_gates, prune_unit_mask, query_heads_of
from headprune.core.units import unit_gates as unit_gates_of
from headprune.engine.ablation import attention_implementation
from headprune.engine.timing import TimeBudgetError
from headprune.measures.evaluation import evaluate_one, swapped_model
from headprune.measures.speed_stage import speed_stage
from headprune.results.points import score_fields
from headprune.results.run_dir import mask_from_json
from headprune.selection.costs import CostModel
from headprune.selection.latency import cached_unit_latency_model, synthetic_inputs
from headprune.selection.lsq import lsq_recover, unit_lsq_recoverer
from headprune.selection.reconstruct import reconstructor
from headprune.selection.unit_costs import unit_bytes_cost_model, unit_flops_cost_model
from headprune.sources.point_models import CONTROL_POINT, recipe_of, save_point_model, saved_dir, saved_model, wants_model
from headprune.stages.calibration_batches import kept_token_batches, kept_token_tuning
from headprune.stages.finetune_runs import checkpoint_folder, control_model, finetune_batches, finetune_in_place, finetune_record
from headprune.stages.pareto_plan import recovery_steps
from headprune.stages.pareto_points import ParetoRun, eval_splits, extra_scores, outcomes, unpruned_point


def cost_model(task, settings, out: Path) -> CostModel:
    """``prune.cost``: analytic FLOPs or weight bytes, or latency tables measured on this machine and cached in ``out/latency``."""
    seq_len = int(settings.seq_len)
    if str(settings.cost) == "flops":
        return unit_flops_cost_model(task.model, task.gates.unit, seq_len)
    if str(settings.cost) == "bytes":
        return unit_bytes_cost_model(task.model, task.gates.unit)
    device = next(task.model.parameters()).device
    inputs = synthetic_inputs(task.model, int(settings.latency_batch_size), seq_len)
    with attention_implementation(task.model, own_attention_name(task.model)):  # the model's own attention, not the gate wrapper
        return cached_unit_latency_model(task.model, inputs, out / "latency", unit=task.gates.unit, device=device)


def recovered_model(
    task, mask: dict, recovery: str, settings, batches: list[dict], tuning, logger, label: str, progress=False, out=None, distil_from=None
):
    """(model, gates, mask to evaluate with, what the point records of its recovery) after ``recovery`` of the units ``mask`` keeps.

    A fine-tune keeps resume checkpoints under the run directory ``out`` (``prune.finetune.checkpoint_every``) and distils
    from ``distil_from`` where given (the control), else from the unpruned model."""
    if recovery == "none":
        return task.model, task.gates, mask, {}
    model = copy.deepcopy(task.model)
    if recovery == "lsq" and lsq_refits_heads_alone(task.gates.unit):  # heads: scales fitted under the mask
        gates = model_gates(model)
        return model, gates, mask, lsq_heads(model, gates, batches, settings, progress, mask=query_heads_of(task.gates, mask, hard=True))
    prune_unit_mask(unit_gates_of(model, task.gates.unit), mask)  # every other recovery works on the physically pruned copy
    batches, tuning = shipped_text(task, model, recovery, settings, batches, tuning)
    call = (model, task.model, batches, tuning, label)
    record = run_recovery(recovery, task.gates.unit, settings, logger, progress, out, call, distil_from)
    return model, model_gates(model), None, record


def shipped_text(task, model, recovery: str, settings, batches: list[dict], tuning, round_: int = 0) -> tuple:
    """(calibration, fine-tune batches) of a recovery of the pruned ``model``: after a vocabulary cut, both split into the
    tokens it keeps; the fine-tune's drawn again (seed of round ``round_``) only for a recovery that trains on them."""
    batches = kept_token_batches(task, model, batches)
    if "finetune" in recovery_steps(recovery):
        tuning = kept_token_tuning(task, model, lambda kept: finetune_batches(task, settings, kept, round_), tuning, batches)
    return batches, tuning


def run_recovery(recovery: str, unit, settings, logger, progress: bool, out, call: tuple, distil_from=None) -> dict:
    """What each step of ``recovery`` records, run in turn on ``call`` = (model, teacher, batches, fine-tune batches, label);
    a fine-tune distils from ``distil_from`` where given, else from the call's teacher."""
    record, folder = {}, checkpoint_folder(out, f"{call[-1]}+{recovery}")
    for step in recovery_steps(recovery):
        record.update(recovery_step(step, unit, settings, logger, progress, folder, distil_from)(*call) or {})
    return record


def lsq_heads(model, gates, batches: list[dict], settings, progress: bool, **fit) -> dict:
    """{"lsq": its report} of the least-squares head scales of ``model`` (``fit``: the mask they are fitted under, or the teacher)."""
    report = {}
    ridge, max_scale = float(settings.lsq.ridge), float(settings.lsq.max_scale)
    lsq_recover(model, gates, batches, ridge=ridge, max_scale=max_scale, progress=progress, report=report, **fit)
    return {"lsq": report}


def recovery_step(step: str, unit, settings, logger, progress: bool = False, checkpoints=None, distil_from=None):
    """One step of a recovery as ``recover(pruned model, teacher, batches, fine-tune batches, label) -> record or None``.

    A fine-tune step distils from ``distil_from`` in place of the teacher where given, saves its state in the folder
    ``checkpoints`` (if any) and resumes from it when rerun."""

    def lsq(model, teacher, batches, tuning, label):
        if not lsq_refits_heads_alone(unit):  # heads, then the other parts, of the pruned model
            unit_lsq_recoverer(unit, float(settings.lsq.ridge), float(settings.lsq.max_scale))(model, teacher, batches)
            return None
        return lsq_heads(model, model_gates(model), batches, settings, progress, teacher=teacher)

    def reconstruct(model, teacher, batches, tuning, label):  # re-solved layer by layer
        solve = reconstructor(
            float(settings.reconstruct.ridge), str(settings.reconstruct.target), progress, str(settings.reconstruct.tokens)
        )
        report = solve(model, teacher, batches)
        lost = [layer for layer, into in (report.get("layers_folded") or {}).items() if into is None]
        if lost:  # post-norm layers, or a stack's first layer: no projection writes the stream unchanged before them
            print(f"[prune] {label}: reconstruct: no kept projection could take the update of the removed layers {lost}", flush=True)
        return {"reconstruct": report}

    def finetune(model, teacher, batches, tuning, label):
        source = teacher if distil_from is None else distil_from
        return finetune_record(finetune_in_place(model, source, tuning or batches, settings.finetune, logger, label, checkpoints))

    return {"lsq": lsq, "reconstruct": reconstruct, "finetune": finetune}[step]  # prune.recover's steps: checked before work


def keep_for_timing(ctx: ParetoRun, key: tuple, model, mask, unit_gates=None) -> None:
    """With ``prune.measure_speed``, keep a recovered model (physically pruned) to time it: generation speed depends on its weights."""
    if ctx.settings.measure_speed:
        if mask is not None:
            prune_unit_mask(unit_gates_of(model, unit_gates.unit), mask)
        ctx.models[key] = model


def measure_points(task, points: list[dict], base_point: dict, ctx: ParetoRun) -> None:
    """Time each distinct physically pruned model against the unpruned one (largest of ``speed.batch_sizes``)."""
    measured: dict[str, dict | None] = {}
    for point in points:
        own = ctx.models.get((point["recovery"], repr(point["mask"])))
        key = repr((point["recovery"], point["mask"])) if own is not None else repr(point["mask"])
        if key not in measured:
            measured[key] = timed_point(task, point, own, ctx)
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


def timed_point(task, point: dict, own, ctx: ParetoRun) -> dict | None:
    """The measured speed of one point's pruned model (``own``: its recovered model), or None when it could not be timed."""
    speed = dataclasses.replace(ctx.speed, check_score=False)  # a recovered model has no masked twin; the mask's was checked
    mask = task.gates.normalize_mask(mask_from_json(point["mask"]), hard=True)
    try:
        stage = speed_stage(task, mask, speed, ctx.seed, pruned_model=own)
    except TimeBudgetError as error:  # the scores stand: only this point's timing is lost
        stage = {"rows": [], "verdict": str(error)}
    if not stage["rows"]:  # the budget cut every timing: the scores stand
        print(f"headprune: point not timed, its quality is kept: {stage['verdict']}", file=sys.stderr)
        return None
    row = stage["rows"][-1]
    return {
        "model": "recovered" if own is not None else "pruned by the mask",
        "batch_size": row["batch_size"],
        "examples_per_s": row["pruned"]["examples_per_s"],
        "original_examples_per_s": row["original"]["examples_per_s"],
        "speedup": 1 + row["gain"],
        "verdict": row.get("verdict"),
        "device": stage["device"],
    }


def control_point(task, ctx: ParetoRun) -> dict:
    """The unpruned model given the same fine-tune as the pruned points (``prune.control``): "unpruned + same training".

    With ``prune.finetune.teacher=control`` the model stays in ``ctx.distil_from``: the points' fine-tunes distil from it."""
    recipe = None
    if ctx.out is not None and wants_model(ctx.settings.save, "finetune", CONTROL_POINT):  # prune.save keeps it: its rounds of batches
        recipe = {**recipe_of(ctx, CONTROL_POINT, "unpruned", "finetune", "0%", None), "rounds": [len(batches) for batches in ctx.rounds]}
    model = saved_model(ctx.out, recipe) if recipe else None
    reused, history = model is not None, None
    if not reused:
        model, history = control_model(task, ctx.rounds, ctx.settings.finetune, ctx.logger, ctx.out)
    with swapped_model(task, model):
        results = {split: evaluate_one(task, None, split, CONTROL_POINT, progress=ctx.progress) for split in eval_splits(ctx)}
    saved = {}
    if recipe:
        scores = {split: result.score for split, result in results.items()}
        saved["model_dir"] = (
            saved_dir(recipe) if reused else save_point_model(ctx.out, model, task.gates, None, task.tokenizer, recipe, scores)
        )
    if str(ctx.settings.finetune.teacher) == "control":
        ctx.distil_from = model.eval()
    del model
    return {
        **unpruned_point(ctx, task),
        "recovery": "finetune",
        "control": True,
        **score_fields(results[ctx.split], ctx.base),
        **outcomes(results[ctx.split]),
        **({"extra": extra_scores(results, ctx)} if ctx.extra_splits else {}),
        **(finetune_record(history) if history is not None else {}),
        **saved,
    }
