"""The study as a table of stages: each row's key, its computation, and what later stages take from it."""

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from headprune.core.unit_kinds import ablation_refusal, keep_one_refusal
from headprune.measures.ablation_stage import ablation_stage, keep_one_stage
from headprune.measures.evaluation import split_size
from headprune.measures.speed_stage import speed_stage
from headprune.results.run_dir import mask_from_json, mask_to_json, tensor_dict
from headprune.results.stream_points import gate_action, streaming
from headprune.results.writer import batches_fingerprint
from headprune.scoring.significance import correlation
from headprune.selection.joint_scale import comparable_scores
from headprune.selection.uniform import layout_masks
from headprune.settings import RunSettings, listed
from headprune.sources.orders import ORDERS, OrderSettings, action_refusal, unit_refusal
from headprune.stages.greedy_stage import prune_stage
from headprune.stages.pareto_plan import for_speed
from headprune.stages.prune_speed import pareto_stage
from headprune.stages.recovery_check import say_worse
from headprune.stages.saved_stages import digest, stage

IMPORTANCE_DATA = "importance batches"  # the data fingerprint of task.importance_batches()


@dataclass
class StudyRun:
    """What the stages of one study share: the task, its splits and unpruned score, the settings, each stage's key and results."""

    cfg: Any
    settings: RunSettings
    task: Any
    out: Path
    split: str  # where every stage scores
    selection: str  # held-out choices (keep_one, max_drop targets)
    ablation_split: str  # the oracle order's data
    base: Any  # the unpruned model's EvalResult on split
    orders: list[str]
    fractions: list[float]
    groups: list[str]
    order_cfg: OrderSettings
    model_fp: str
    data_fps: dict = field(default_factory=dict)  # data name -> fingerprint, computed once
    shared: dict = field(default_factory=dict)  # unmasked order scores shared by the stages
    keys: dict = field(default_factory=dict)  # stage -> its key
    results: dict = field(default_factory=dict)  # stage -> its results
    upstream: dict = field(default_factory=dict)  # stage -> digest of its key and results: what a later stage saw of it
    speed_mask: dict | None = None  # the mask the speed stage times

    def data_fingerprint(self, name: str) -> str:
        """The fingerprint of a split, or of the importance batches (what the importance and entropy scores read)."""
        if name not in self.data_fps:
            task = self.task
            self.data_fps[name] = batches_fingerprint(task.importance_batches()) if name == IMPORTANCE_DATA else task.data_fingerprint(name)
        return self.data_fps[name]

    def key(self, reads: dict, data: list[str], inputs: dict | None = None) -> dict:
        """A stage's key: the settings it reads, the model and data it runs on, digests of the earlier stages it uses."""
        gates = self.task.gates  # a streaming study's stages also depend on its unit, sink and window
        stream = {"stream": {"unit": gates.unit, "sink": int(gates.sink), "window": int(gates.window)}} if streaming(self.task) else {}
        return {
            "settings": {"seed": int(self.cfg.seed), **stream, **reads},
            "fingerprints": {"model": self.model_fp, "data": {name: self.data_fingerprint(name) for name in dict.fromkeys(data)}},
            "inputs": inputs or {},
        }


@dataclass(frozen=True)
class Stage:
    """One row of the study: its key, how to compute it, what later stages take from it, and whether it runs at all."""

    name: str
    key: Callable[[StudyRun], dict]
    compute: Callable[[StudyRun], dict]
    share: Callable[[StudyRun, dict], None] | None = None  # after the stage: what later stages read of its results
    wanted: Callable[[StudyRun], bool] | None = None  # None: always


def raw_scores(ctx: StudyRun) -> dict:
    cache: dict = {}  # the orders keep their unmasked raw scores here
    action = gate_action(ctx.task.gates)
    orders = [  # entropy: attention units that are removed
        o for o in ("importance", "entropy") if unit_refusal(o, ctx.task.gates.unit) is None and action_refusal(o, action) is None
    ]
    for order in orders:
        ORDERS[order].scores(ctx.task, ctx.order_cfg, shared=cache)
    return {order: tensor_dict(cache[f"{order}_raw"]) for order in orders}


def share_scores(ctx: StudyRun, scores: dict) -> None:
    for order, raw in scores.items():  # importance, and entropy where the unit and action take it
        ctx.shared[f"{order}_raw"] = {g: torch.tensor(v) for g, v in raw.items()}


def single_units(ctx: StudyRun) -> bool:
    """Whether removing one unit at a time is a useful measure in the task's unit (ablate and keep_one run; not for neurons)."""
    return ablation_refusal(ctx.task.gates.unit) is None


def ablation_splits(ctx: StudyRun) -> list[str]:
    """The evaluation split, then every non-empty ``study.extra_splits`` (the section 3.4 correlation)."""
    return [ctx.split] + [s for s in listed(ctx.settings.study.extra_splits) if split_size(ctx.task, s) > 0]


def ablate_key(ctx: StudyRun) -> dict:
    study = ctx.settings.study
    splits = ablation_splits(ctx)
    return ctx.key({"splits": splits, "n_samples": int(study.n_samples), "alpha": float(study.alpha)}, splits)


def bootstrap(ctx: StudyRun) -> tuple[int, int, float]:
    """(resamples, seed, alpha) of the paired tests of the ablate and keep_one stages."""
    return int(ctx.settings.study.n_samples), int(ctx.cfg.seed), float(ctx.settings.study.alpha)


def ablate_all(ctx: StudyRun) -> dict:
    base = {ctx.split: ctx.base}  # an extra split's unpruned score is computed by its stage
    return {
        "splits": {s: ablation_stage(ctx.task, s, None, *bootstrap(ctx), progress=True, base=base.get(s)) for s in ablation_splits(ctx)}
    }


def share_ablation(ctx: StudyRun, ablate: dict) -> None:
    splits = list(ablate["splits"])
    if len(splits) > 1:
        ablate["correlation"] = correlation(ablate["splits"][splits[0]], ablate["splits"][splits[1]])
    if ctx.ablation_split in ablate["splits"]:
        ctx.shared["ablation_deltas"] = {g: torch.tensor(v) for g, v in ablate["splits"][ctx.ablation_split]["delta"].items()}


def keep_one_key(ctx: StudyRun) -> dict:
    study = ctx.settings.study
    reads = {"split": ctx.split, "selection": ctx.selection, "n_samples": int(study.n_samples), "alpha": float(study.alpha)}
    return ctx.key(reads, [ctx.split, ctx.selection])


def keep_one_all(ctx: StudyRun) -> dict:
    return keep_one_stage(ctx.task, ctx.selection, ctx.split, None, *bootstrap(ctx), progress=True, base=ctx.base)


def prune_key(ctx: StudyRun) -> dict:
    reads = {"split": ctx.split, "prune": ctx.cfg.prune, "importance": ctx.cfg.importance, "reestimate": ctx.settings.study.reestimate}
    inputs = {"scores": ctx.upstream["scores"], "ablate": ctx.upstream["ablate"] if "ablation_deltas" in ctx.shared else None}
    return ctx.key(reads, [ctx.split, ctx.ablation_split, IMPORTANCE_DATA], inputs)


def prune_all(ctx: StudyRun) -> dict:
    """Every order's curve; re-estimated curves with ``study.reestimate``; one group at a time (paper section 5)."""
    task, prune = ctx.task, ctx.settings.prune

    def curves(orders, shared, **narrowed):
        return prune_stage(task, prune, orders, ctx.fractions, ctx.order_cfg, ctx.split, shared, progress=True, base=ctx.base, **narrowed)

    result = curves(ctx.orders, ctx.shared)
    if ctx.settings.study.reestimate:  # one more curve per order that can be recomputed under the current mask
        for order in [o for o in ctx.orders if ORDERS[o].reestimable]:
            result["orders"][f"{order} (re-estimated)"] = curves([order], {}, reestimate=True)["orders"][order]
    if len(task.gates.groups) > 1:  # one group at a time
        result["by_group"] = {g: curves(["importance"], {}, groups=[g], min_per_layer=0) for g in task.gates.groups}
    return result


def pareto_key(ctx: StudyRun) -> dict:
    cfg = ctx.cfg
    reads = {
        "split": ctx.split,
        "selection": ctx.selection,
        "prune": cfg.prune,
        "importance": cfg.importance,
        "speed": cfg.speed if ctx.settings.prune.measure_speed else None,
    }
    return ctx.key(reads, [ctx.split, ctx.selection, IMPORTANCE_DATA], {"scores": ctx.upstream["scores"]})


def pareto_all(ctx: StudyRun) -> dict:
    where = {"split": ctx.split, "selection": ctx.selection, "seed": int(ctx.cfg.seed), "base": ctx.base, "shared": ctx.shared}
    result = pareto_stage(ctx.task, ctx.settings, ctx.order_cfg, ctx.orders, ctx.fractions, where, ctx.out, False)
    say_worse(result["points"])
    return result


def speed_mask(ctx: StudyRun) -> dict:
    """The prune stage's importance mask at ``speed.fraction``, or the importance scores' mask there."""
    fraction = float(ctx.settings.speed.fraction)
    orders = ctx.results["prune"]["orders"]
    steps = {round(s["fraction"], 6): s for s in (orders["importance"]["steps"] if "importance" in orders else [])}
    if round(fraction, 6) in steps:
        return ctx.task.gates.normalize_mask(mask_from_json(steps[round(fraction, 6)]["mask"]))
    layout = str(ctx.settings.prune.layout)
    scores = comparable_scores(ctx.shared["importance_raw"], str(ctx.settings.prune.joint_scale))
    return layout_masks(scores, ctx.task.gates.groups, [fraction], ctx.groups, layout=layout)[0]


def speed_key(ctx: StudyRun) -> dict:
    ctx.speed_mask = speed_mask(ctx)
    inputs = {"mask": mask_to_json(ctx.speed_mask), "prune": ctx.upstream["prune"]}
    return ctx.key({"split": ctx.split, "speed": ctx.cfg.speed}, [ctx.split], inputs)


def speed_all(ctx: StudyRun) -> dict:
    return speed_stage(ctx.task, ctx.speed_mask, ctx.settings.speed, int(ctx.cfg.seed))


STUDY_STAGES = (
    Stage("scores", lambda ctx: ctx.key({"importance": ctx.cfg.importance}, [IMPORTANCE_DATA]), raw_scores, share_scores),
    Stage("ablate", ablate_key, ablate_all, share_ablation, wanted=single_units),
    Stage("keep_one", keep_one_key, keep_one_all, wanted=lambda ctx: single_units(ctx) and keep_one_refusal(ctx.task.gates.unit) is None),
    Stage("prune", prune_key, prune_all),
    Stage("pareto", pareto_key, pareto_all, wanted=lambda ctx: for_speed(ctx.settings.prune)),
    Stage("speed", speed_key, speed_all, wanted=lambda ctx: not streaming(ctx.task)),  # a streamed unit keeps its weights
)


def run_stage(ctx: StudyRun, row: Stage) -> None:
    """Reuse or compute one stage, then hand later stages what they read of it."""
    if row.wanted is not None and not row.wanted(ctx):
        return
    key = row.key(ctx)
    results = stage(ctx.out, row.name, key, lambda: row.compute(ctx))
    ctx.keys[row.name], ctx.results[row.name] = key, results
    ctx.upstream[row.name] = digest([key, results])
    if row.share is not None:
        row.share(ctx, results)
