"""The records of pruning for speed: what every point of one run shares (``ParetoRun``) and each point's JSON record."""

from dataclasses import dataclass, field
from typing import Any

from headprune.core.unit_kinds import is_joint
from headprune.core.units import query_heads_of
from headprune.results.points import kinds_label, measures, relative_to, score_fields, units_by_kind, what_was_removed
from headprune.results.run_dir import mask_to_json
from headprune.selection.costs import CostModel
from headprune.selection.greedy import heads_removed
from headprune.selection.mask_search import PruneTarget
from headprune.settings import PruneSettings
from headprune.sources.orders import OrderSettings


def step_label(step) -> str:
    """How a step is written: ``speedup=1.3`` for a target, ``40%`` for a fraction of the heads."""
    return f"{step.kind}={step.value:g}" if isinstance(step, PruneTarget) else f"{100 * step:.0f}%"


@dataclass
class ParetoRun:
    """What every point of one pruning-for-speed run shares: settings, data, costs, and what was computed so far."""

    settings: PruneSettings
    order_settings: OrderSettings
    shared: dict  # unmasked order scores, shared by a study's stages
    split: str  # where points are scored
    selection: str  # where a max_drop target is measured
    base: Any  # the unpruned model's EvalResult on split
    groups: list[str]  # the attention groups pruned
    min_per_layer: int
    costs: CostModel  # the cost model the search reads (FLOPs, latency or weight bytes)
    flops: CostModel  # FLOPs, for every point's flops_kept
    read_bytes: CostModel  # the weight bytes a decoded token reads, for every point's bytes_kept
    batches: list  # recovery batches (lsq; the fine-tune's teacher inputs)
    logger: Any  # Lightning logger or False
    tuning: list | None  # one-shot fine-tune training batches
    rearrange: list[bool]
    layout: str  # global or uniform (headprune.selection.uniform)
    extra_splits: list[str]  # more evaluation splits for every point (prune.extra_splits)
    base_extra: dict  # split -> the unpruned model's EvalResult there
    rounds: list  # fine-tune batches of each round (one-shot: one round); the control's too
    speed: Any  # the speed settings that time the points (prune.measure_speed)
    seed: int
    models: dict = field(default_factory=dict)  # (recovery, mask key) -> recovered model kept for timing
    evaluated: dict = field(default_factory=dict)  # (recovery, mask key) -> {split: result}, reused across orders
    recovery_records: dict = field(default_factory=dict)  # (recovery, mask key) -> what its recovery adds to the point
    out: Any = None  # the run directory: recovered models go to <out>/models/<point> (prune.save)
    saved: dict = field(default_factory=dict)  # (recovery, mask key) -> the saved model's directory, relative to out
    alone: dict = field(default_factory=dict)  # mask key -> its EvalResult on the selection split without recovery
    progress: bool = False  # progress bars while scoring, recovering and evaluating
    distil_from: Any = None  # the model the points' fine-tunes distil from when not the unpruned one (the control's)


def eval_splits(ctx: ParetoRun) -> list[str]:
    """The evaluation split, then ``prune.extra_splits``: every point is scored on each."""
    return [ctx.split, *ctx.extra_splits]


def extra_scores(results: dict, ctx: ParetoRun) -> dict:
    """{split: {"score", "relative"}} of a point on each of ``prune.extra_splits`` (relative to the unpruned model there)."""
    return {split: {"score": results[split].score, **relative_to(results[split], ctx.base_extra[split])} for split in ctx.extra_splits}


def outcomes(result) -> dict:
    """{"per_example": ...}: a result's per-example outcomes (correct / NLL and tokens) that paired tests read, where it has them."""
    return {"per_example": {k: list(v) for k, v in result.per_example.items()}} if getattr(result, "per_example", None) else {}


def point_record(order, recovery, step, mask, results: dict, ctx: ParetoRun, task) -> dict:
    """One Pareto point: ``results`` holds its result on every evaluation split (``eval_splits``)."""
    result = results[ctx.split]
    return {
        "order": order,
        "recovery": recovery,
        "step": step_label(step),
        "target": {step.kind: step.value} if isinstance(step, PruneTarget) else None,
        "fraction": None if isinstance(step, PruneTarget) else float(step),
        **({} if isinstance(step, PruneTarget) else what_was_removed(float(step), heads_removed(mask), task.gates.num_heads)),
        "units_removed": heads_removed(mask),
        "query_heads_removed": heads_removed(query_heads_of(task.gates, mask)),
        "units_total": task.gates.num_heads,
        "units_by_kind": units_by_kind(mask_to_json(mask), task.gates.unit),
        **score_fields(result, ctx.base),  # a vocabulary cut scored through its own tokenizer: relative per byte
        **outcomes(result),
        **({"extra": extra_scores(results, ctx)} if ctx.extra_splits else {}),
        "predicted_speedup": ctx.costs.speedup(mask),
        "flops_kept": ctx.flops.kept_fraction(mask),
        "bytes_kept": ctx.read_bytes.kept_fraction(mask),
        "cost_unit": ctx.costs.unit,
        "mask": mask_to_json(mask),
        **({"kinds_removed": kinds_label(mask_to_json(mask), task.gates.unit)} if is_joint(task.gates.unit) else {}),
    }


def mask_key(mask: dict) -> str:
    """A mask as a hashable key (its JSON form), the same for a tensor mask and its results.json copy."""
    return repr(mask_to_json(mask))


def unpruned_point(ctx: ParetoRun, task) -> dict:
    """The unpruned model's point: its score on every evaluation split, speed-up 1."""
    return {
        "order": "unpruned",
        "recovery": "none",
        "step": "0%",
        "target": None,
        "fraction": 0.0,
        "units_removed": 0,
        "query_heads_removed": 0,
        "units_total": task.gates.num_heads,
        "score": ctx.base.score,
        "relative": 1.0,
        **measures(ctx.base),
        **outcomes(ctx.base),
        **({"extra": {s: {"score": r.score, "relative": 1.0} for s, r in ctx.base_extra.items()}} if ctx.extra_splits else {}),
        "predicted_speedup": 1.0,
        "flops_kept": 1.0,
        "bytes_kept": 1.0,
        "cost_unit": ctx.costs.unit,
    }
