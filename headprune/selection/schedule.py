"""Iterative pruning: prune to 20%, recover, re-score the recovered model, prune to 40%, recover, ..."""

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from headprune.core.units import prune_unit_mask, unit_gates
from headprune.scoring.importance import fisher_scores, per_example_loss
from headprune.selection.greedy import check_fractions, check_groups
from headprune.selection.joint_scale import comparable_scores
from headprune.selection.kept_widths import round_kept_widths
from headprune.selection.mask_search import SHARES, PruneTarget
from headprune.selection.uniform import layout_mask, layout_search


@dataclass
class PruneStep:
    """One step of a schedule: the fraction of the original heads pruned, the cumulative mask and the model after recovery."""

    fraction: float  # of the original heads removed so far
    mask: dict[str, torch.Tensor]  # {group: 0/1 [layers, units]} over the original heads (or KV groups)
    scores: dict[str, torch.Tensor]  # the scores this step pruned by (estimated on the previous step's recovered model)
    model: nn.Module | None  # a copy of the pruned, recovered model (None with keep_models=False)
    target: PruneTarget | None = None  # the step's target when the schedule gives targets


def _fisher(model, gates, batches, loss_fn):
    return fisher_scores(model, gates, batches, loss_fn=loss_fn, unit=gates.unit)


def check_schedule(schedule) -> list:
    """Growing fractions ([0.2, 0.4, 0.6]) or targets of one kind ([{"speedup": 1.2}, {"speedup": 1.5}]), or a ValueError."""
    steps = list(schedule or [])
    if not steps:
        raise ValueError("the pruning schedule is empty: give growing fractions such as [0.2, 0.4, 0.6]")
    is_target = [hasattr(step, "items") or isinstance(step, PruneTarget) for step in steps]
    if all(is_target):  # one kind of target, each step beyond the one before (a speed-up that grows, a share that shrinks)
        targets = [PruneTarget.from_config(step) for step in steps]
        kinds = sorted({t.kind for t in targets})
        if len(kinds) > 1:
            raise ValueError(f"a schedule of targets uses one kind of target, got {kinds}: e.g. [{{speedup: 1.2}}, {{speedup: 1.5}}]")
        for before, after in zip(targets, targets[1:]):
            met = (after.kind == "speedup" and after.value <= before.value) or (after.kind in SHARES and after.value >= before.value)
            if met:
                raise ValueError(
                    f"step {after.kind}={after.value:g} is already met by the step before it ({before.kind}={before.value:g}): "
                    f"a schedule must go further at every step ({'growing speed-ups' if after.kind == 'speedup' else f'shrinking {after.kind} shares'})"
                )
        return targets
    if any(is_target):
        raise ValueError(
            f"a schedule is all fractions ([0.2, 0.4]) or all targets ([{{speedup: 1.2}}, {{speedup: 1.5}}]), not a mix: got {steps}"
        )
    wrong = [step for step in steps if isinstance(step, bool) or not isinstance(step, (int, float))]
    if wrong:
        raise ValueError(f"a schedule step is a fraction of the heads (0.2) or a target ({{speedup: 1.2}}), got {wrong[0]!r}")
    fractions = check_fractions(steps)
    if fractions[0] == 0.0:
        raise ValueError(f"a schedule step of 0 prunes nothing: start with a fraction above 0, e.g. [0.2, 0.4]; got {steps}")
    if [float(f) for f in steps] != fractions:
        raise ValueError(f"a pruning schedule must grow step by step, e.g. [0.2, 0.4, 0.6]; got {steps}")
    return fractions


def iterative_prune(
    model: nn.Module,
    schedule,
    batches: Iterable[dict],
    loss_fn: Callable = per_example_loss,
    recover: Callable | None = None,
    score_fn: Callable = _fisher,
    min_per_layer: int = 0,
    groups=None,
    teacher: nn.Module | None = None,
    keep_models: bool = True,
    costs=None,
    evaluate: Callable | None = None,
    unit: str = "head",
    layout: str = "global",
    joint_scale: str = "loss",
    widths: dict[str, int] | None = None,
) -> list[PruneStep]:
    """Prune ``model`` in place to each step of ``schedule`` in turn, re-scoring and recovering after each step."""
    plan = check_schedule(schedule)
    if isinstance(plan[0], PruneTarget) and costs is None:
        raise ValueError("a schedule of targets needs costs= (headprune.selection.costs.flops_cost_model(model) of the unpruned model)")
    batches = list(batches)
    teacher = copy.deepcopy(model).eval() if teacher is None else teacher
    steps = []
    for step in plan:
        gates = unit_gates(model, unit)
        shape = gates.groups
        chosen = check_groups(groups, shape)
        scores = score_fn(model, gates, batches, loss_fn)
        present = {g: p.float() for g, p in gates.present().items()}
        if isinstance(step, PruneTarget):
            search = layout_search(layout)
            ranked = comparable_scores(scores, joint_scale, costs, present)
            mask = search(ranked, costs, step, evaluate=evaluate, start=present, min_per_layer=min_per_layer, groups=chosen).mask
        else:
            ranked = comparable_scores(scores, joint_scale, present=present)
            mask = layout_mask(ranked, shape, step, chosen, min_per_layer, layout, start=present)
        up = isinstance(step, PruneTarget) and step.kind == "max_drop"  # the score bound stays met; a cost or count, rounded down
        mask = round_kept_widths(mask, ranked, widths or {}, unit, up=up)  # widths: headprune.selection.kept_widths.width_multiples
        prune_unit_mask(gates, mask)
        if recover is not None:
            recover(model, teacher, batches)
        target = step if isinstance(step, PruneTarget) else None
        total = sum(layers * units for layers, units in shape.values())
        fraction = sum(int((m == 0).sum()) for m in mask.values()) / total if target else step
        steps.append(PruneStep(fraction, mask, scores, copy.deepcopy(model) if keep_models else None, target))
    return steps
