"""Cost-aware mask search: remove heads by score per unit of cost saved until a target is met."""

import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from headprune.selection.costs import CostModel, CostsAlong, first_meeting
from headprune.selection.greedy import Head, check_groups, group_floors, layer_floors

TARGET_KINDS = ("flops", "bytes", "speedup", "max_drop")
SHARES = {"flops": "FLOPs", "bytes": "weight bytes a decoded token reads"}  # targets that keep a share of a cost, in (0, 1)
COST_NAMES = {"flops": "FLOPs", "bytes": "bytes"}  # the cost model each share is counted by


def given_target(value):
    """The target setting, or None when it is unset (null, or a mapping whose kinds are all null)."""
    if value is None or (hasattr(value, "items") and all(v is None for _, v in value.items())):
        return None
    return value


@dataclass(frozen=True)
class PruneTarget:
    """One validated pruning target: ``flops`` or ``bytes`` in (0, 1), ``speedup`` > 1 or ``max_drop`` >= 0."""

    kind: str
    value: float

    def __post_init__(self):
        if self.kind not in TARGET_KINDS:
            raise ValueError(f"unknown pruning target {self.kind!r}; give one of {list(TARGET_KINDS)}, e.g. {{speedup: 1.3}}")
        value = self.value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or math.isinf(value):
            raise ValueError(f"pruning target {self.kind} must be a finite number, got {value!r}")
        if self.kind in SHARES and not 0.0 < value < 1.0:
            raise ValueError(
                f"{self.kind} target {value} is the fraction of the model's {SHARES[self.kind]} kept: it must be in (0, 1), e.g. 0.6 "
                "(1 or more removes nothing)"
            )
        if self.kind == "speedup" and value <= 1.0:
            raise ValueError(f"speedup target {value} must be > 1 (1.3 = 30% faster); 1 or less removes nothing")
        if self.kind == "max_drop" and value < 0:
            raise ValueError(f"max_drop target {value} is the metric points one may lose: it must be >= 0")

    @classmethod
    def from_config(cls, config) -> "PruneTarget":
        """A target from a one-key mapping such as ``{"speedup": 1.3}``."""
        if isinstance(config, cls):
            return config
        if not hasattr(config, "items"):
            raise ValueError(f"a pruning target is a mapping with one key of {list(TARGET_KINDS)}, got {config!r}")
        given = {str(k): v for k, v in config.items() if v is not None}
        unknown = sorted(set(given) - set(TARGET_KINDS))
        if unknown:
            raise ValueError(f"unknown pruning target key(s) {unknown}; choose one of {list(TARGET_KINDS)}")
        if len(given) != 1:
            raise ValueError(f"give exactly one pruning target of {list(TARGET_KINDS)}, got {sorted(given) or 'none'}")
        kind, value = next(iter(given.items()))
        return cls(kind, float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value)


@dataclass
class SearchResult:
    """The chosen mask, the heads it removes (in removal order) and what the cost model predicts for it."""

    mask: dict[str, torch.Tensor]
    removed: list[Head]
    cost: float
    kept_fraction: float  # of the cost model's total (FLOPs kept for a FLOPs model)
    speedup: float
    target: PruneTarget
    evaluations: dict[int, float] = field(default_factory=dict)  # heads removed -> selection score (max_drop)


class SearchPath(NamedTuple):
    """The levels a search walks: level i's mask, each level's predicted cost, and how a level's result is described."""

    mask_at: Callable[[int], dict]  # level i -> its mask (before ``refine``)
    predicted: list[float]  # the predicted cost of each level, lowest level (nothing removed) first
    removed: Callable[[dict, int], list]  # (a level's mask, i) -> the units it removes, in removal order
    unmet: tuple[str, str]  # where and what the last level removes, advice: the message when no level meets the target
    key: Callable[[dict], int] | None  # the key a mask's score is kept under; None: by level


def start_mask(shape: dict[str, tuple[int, int]], start=None) -> dict[str, torch.Tensor]:
    """A float CPU copy of ``start``'s mask of each group of ``shape``, all ones where it has none."""
    return {
        g: start[g].detach().cpu().clone().float() if start is not None and g in start else torch.ones(l, h) for g, (l, h) in shape.items()
    }


def nonnegative(scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Scores shifted to >= 0 when some are negative (score / cost needs a common zero); the order is unchanged."""
    low = min(float(s.min()) for s in scores.values())
    return {g: s.double() - low if low < 0 else s.double() for g, s in scores.items()}


def removal_order(scores: dict[str, torch.Tensor], costs: CostModel, start=None, min_per_layer: int = 0, groups=None) -> list[Head]:
    """Every unit the greedy score-per-saving search would remove, in order (``start``'s zeros are already gone)."""
    shape = costs.groups
    groups = check_groups(groups, shape)
    scores = nonnegative({g: scores[g].detach().cpu() for g in groups})
    mask = start_mask(shape, start)
    queues, kept, heap = {}, {}, []
    floors, group_kept = group_floors(shape), {g: int((m != 0).sum()) for g, m in mask.items()}
    per_layer = layer_floors(shape, min_per_layer)
    values_of = {g: scores[g].tolist() for g in groups}

    def offer(gi: int, group: str, layer: int) -> None:
        """Push a layer's next unit with its key, unless the layer is at its floor or removing buys nothing."""
        count, queue = kept[group, layer], queues[group, layer]
        if not queue or count - 1 < per_layer[group]:
            return
        saving = costs.saving(group, layer, count)
        if saving <= 0:
            return  # removing it buys nothing (the last head leaves a phantom that costs the same)
        heapq.heappush(heap, (float(values_of[group][layer][queue[-1]]) / saving, gi, layer, queue[-1], group))

    for gi, group in enumerate(groups):
        values = values_of[group]
        for layer in range(shape[group][0]):
            alive = [h for h in mask[group][layer].nonzero().flatten().tolist() if values[layer][h] != math.inf]  # +inf: a floor
            queues[group, layer] = sorted(alive, key=lambda h: (float(values[layer][h]), h))[::-1]  # lowest score last
            kept[group, layer] = len(alive)
            offer(gi, group, layer)
    order: list[Head] = []
    while heap:
        _, gi, layer, head, group = heapq.heappop(heap)
        if group_kept[group] - 1 < floors[group]:
            continue  # the group is at its kind's floor (a stack keeps a layer): none of its units goes any more
        queues[group, layer].pop()
        kept[group, layer] -= 1
        group_kept[group] -= 1
        order.append((group, layer, head))
        offer(gi, group, layer)
    return order


def mask_after(order: list[Head], k: int, shape: dict[str, tuple[int, int]], start=None) -> dict[str, torch.Tensor]:
    """``start`` (or all ones) with the first ``k`` heads of ``order`` removed."""
    mask = start_mask(shape, start)
    for group, layer, head in order[:k]:
        mask[group][layer, head] = 0.0
    return mask


def global_path(scores: dict[str, torch.Tensor], costs: CostModel, start, min_per_layer: int, groups) -> SearchPath:
    """The greedy score-per-saving path of ``search_mask``: level k removes the first k units of ``removal_order``."""
    order = removal_order(scores, costs, start, min_per_layer, groups)
    kept, predicted = costs.kept_counts(start), [costs.cost(start)]  # the predicted cost after k = 0..n removals
    for group, layer, _ in order:
        predicted.append(predicted[-1] - costs.saving(group, layer, int(kept[group][layer])))
        kept[group][layer] -= 1
    unmet = f"with min_per_layer={min_per_layer}: removing every removable unit (a layer stack and the residual stream keep one)", ""
    return SearchPath(lambda k: mask_after(order, k, costs.groups, start), predicted, lambda mask, k: order[:k], unmet, None)


def search_mask(
    scores: dict[str, torch.Tensor],
    costs: CostModel,
    target,
    evaluate: Callable | None = None,
    higher_is_better: bool = True,
    start=None,
    min_per_layer: int = 0,
    groups=None,
    refine: Callable | None = None,
    path: Callable[..., SearchPath] = global_path,
) -> SearchResult:
    """The mask that meets ``target`` (a PruneTarget or a one-key dict) at the first level of ``path`` (the greedy order, or
    ``uniform.uniform_path``); a level's mask is ``refine``d, its cost the pruned model's own where ``costs`` counts it."""
    target = PruneTarget.from_config(target)
    mask_at, predicted, removed, unmet, key = path(scores, costs, start, min_per_layer, groups)  # a SearchPath
    refine = refine or (lambda mask: mask)
    along = CostsAlong(costs, mask_at, len(predicted)) if costs.exact is not None else predicted
    evaluations: dict = {}

    def score_of(i: int) -> float:
        mask = None if key is None and i in evaluations else refine(mask_at(i))  # a level's mask made once when keyed by level
        k = i if key is None else key(mask)
        if k not in evaluations:
            evaluations[k] = float(evaluate(mask))
        return evaluations[k]

    level = target_level(target, costs, along, evaluate is not None, score_of, higher_is_better)
    if level is None:
        raise ValueError(
            f"target {target.kind}={target.value} cannot be met {unmet[0]} keeps {along[-1] / costs.total:.3f} of the cost, a speed-up "
            f"of {costs.total / along[-1]:.3f} ({costs.unit}){unmet[1]}"
        )
    mask = refine(mask_at(level))
    return SearchResult(mask, removed(mask, level), costs.cost(mask), costs.kept_fraction(mask), costs.speedup(mask), target, evaluations)


def target_level(target, costs: CostModel, cost_at: list[float], can_evaluate: bool, score_of, higher_is_better: bool) -> int | None:
    """The level (index into ``cost_at``) that meets ``target``: the first for flops / bytes / speedup, the last within max_drop."""
    if target.kind in SHARES:
        if costs.unit != target.kind:
            raise ValueError(
                f"a {target.kind} target needs a {COST_NAMES[target.kind]} cost model (prune.cost={target.kind}: "
                f"unit_costs.unit_{target.kind}_cost_model), got a {costs.unit} one"
            )
        total = costs.total
        return first_meeting(cost_at, lambda c: c / total <= target.value + 1e-12)
    if target.kind == "speedup":
        total = costs.total
        return first_meeting(cost_at, lambda c: total / c >= target.value - 1e-12)
    if not can_evaluate:
        raise ValueError("a max_drop target needs evaluate(mask) -> score on a selection split")
    base = score_of(0)
    drop = lambda k: (base - score_of(k)) if higher_is_better else (score_of(k) - base)  # noqa: E731
    low, high = 0, len(cost_at) - 1  # the last level within max_drop, by bisection
    while low < high:
        mid = (low + high + 1) // 2
        if drop(mid) <= target.value + 1e-12:
            low = mid
        else:
            high = mid - 1
    return low
