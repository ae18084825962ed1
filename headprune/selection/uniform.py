"""The uniform layout: every layer of a group loses the same number of units (heads or KV groups)."""

import math
from collections.abc import Callable

import torch

from headprune.selection.greedy import Head, check_fractions, check_groups, greedy_mask, n_to_prune, ranked_heads
from headprune.selection.mask_search import PruneTarget, SearchResult, searched_level
from headprune.selection.uniform_path import UniformPath

LAYOUTS = ("global", "uniform")


def check_layout(layout: str) -> str:
    """The layout name, or a ValueError listing the known ones."""
    if layout not in LAYOUTS:
        raise ValueError(f"prune.layout must be one of {list(LAYOUTS)}, got {layout!r}")
    return layout


def layout_of(settings) -> str:
    """``prune.layout`` of the prune settings, checked."""
    return check_layout(str(settings.layout))


def uniform_counts(fraction: float, shape: dict[str, tuple[int, int]], groups: list[str], min_per_layer: int = 0) -> dict[str, int]:
    """{group: units removed per layer}: floor(fraction x units per layer), at most units - max(min_per_layer, 1)."""
    counts = {}
    for group in groups:
        units = shape[group][1]
        counts[group] = min(int(math.floor(fraction * units + 1e-9)), units - max(min_per_layer, 1))
    return counts


def _start_mask(shape: dict[str, tuple[int, int]], start=None) -> dict[str, torch.Tensor]:
    return {
        g: (start[g].detach().cpu().clone().float() if start is not None and g in start else torch.ones(l, h))
        for g, (l, h) in shape.items()
    }


def uniform_mask(
    scores: dict[str, torch.Tensor], shape: dict[str, tuple[int, int]], counts: dict[str, int], start: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """``start`` (or all ones) with the lowest-scoring units of every layer removed until ``counts[group]`` are gone per layer."""
    mask = _start_mask(shape, start)
    for group, count in counts.items():
        value = scores[group].detach().float().cpu()
        for layer in range(shape[group][0]):
            row = mask[group][layer]
            gone = int((row == 0).sum())
            kept = sorted(row.nonzero().flatten().tolist(), key=lambda h: (float(value[layer, h]), h))  # lowest score first
            for head in kept[: max(count - gone, 0)]:
                row[head] = 0.0
    return mask


def layout_mask(
    scores: dict[str, torch.Tensor],
    shape: dict[str, tuple[int, int]],
    fraction: float,
    groups=None,
    min_per_layer: int = 0,
    layout: str = "global",
    start: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The mask of one fraction in ``layout`` (``start``'s zeros count as removed)."""
    groups = check_groups(groups, shape)
    if check_layout(layout) == "global":
        return greedy_mask(ranked_heads(scores, groups), shape, n_to_prune(fraction, shape, groups), min_per_layer, start=start)
    return uniform_mask(scores, shape, uniform_counts(fraction, shape, groups, min_per_layer), start)


def layout_masks(
    scores: dict[str, torch.Tensor],
    shape: dict[str, tuple[int, int]],
    fractions,
    groups=None,
    min_per_layer: int = 0,
    layout: str = "global",
) -> list[dict[str, torch.Tensor]]:
    """One mask per fraction from a fixed score, nested (each removes a superset of the previous one's units)."""
    return [layout_mask(scores, shape, f, groups, min_per_layer, layout) for f in check_fractions(fractions)]


def layer_counts(mask: dict[str, torch.Tensor]) -> dict[str, list[int]]:
    """{group: units removed in each layer} of a 0/1 mask."""
    return {g: (m == 0).sum(-1).long().tolist() for g, m in mask.items()}


def is_uniform(mask: dict[str, torch.Tensor]) -> bool:
    """Whether every layer of each group removes as many units as the group's other layers."""
    return all(len(set(counts)) <= 1 for counts in layer_counts(mask).values())


def _removed_in_order(
    mask: dict[str, torch.Tensor], start: dict[str, torch.Tensor], scores: dict[str, torch.Tensor], groups: list[str]
) -> list[Head]:
    """The units ``mask`` removes beyond ``start``, lowest score first (the order of a SearchResult)."""
    new = [(g, l, h) for g in groups for l, h in ((mask[g] == 0) & (start[g] != 0)).nonzero().tolist()]
    return sorted(new, key=lambda u: (float(scores[u[0]][u[1], u[2]]), groups.index(u[0]), u[1], u[2]))


def uniform_search(
    scores: dict[str, torch.Tensor],
    costs,
    target,
    evaluate: Callable | None = None,
    higher_is_better: bool = True,
    start=None,
    min_per_layer: int = 0,
    groups=None,
    refine: Callable | None = None,
) -> SearchResult:
    """``mask_search.search_mask`` in the uniform layout: the uniform counts (every layer of the chosen groups) that meet ``target``."""
    target = PruneTarget.from_config(target)
    shape = costs.groups
    groups = check_groups(groups, shape)
    base = _start_mask(shape, start)
    path = UniformPath(scores, costs, base, groups, max(min_per_layer, 1))
    levels = path.levels()
    raw = lambda i: uniform_mask(scores, shape, levels[i], base)  # noqa: E731
    removed = lambda mask: sum(int((mask[g] == 0).sum()) for g in groups)  # noqa: E731
    predicted = [path.cost(counts) for counts in levels]
    i, mask, cost_at, evaluations = searched_level(target, costs, raw, predicted, evaluate, higher_is_better, refine, removed)
    if i is None:
        raise ValueError(
            f"target {target.kind}={target.value} cannot be met in the uniform layout with min_per_layer={min_per_layer}: "
            f"removing {_counts_text(levels[-1])} units in every layer keeps {cost_at[-1] / costs.total:.3f} of the cost, a speed-up "
            f"of {costs.total / cost_at[-1]:.3f} ({costs.unit}); use prune.layout=global or a lower target"
        )
    return SearchResult.of(mask, _removed_in_order(mask, base, scores, groups), costs, target, evaluations)


def _counts_text(counts: dict[str, int]) -> str:
    """``3`` when every group removes as many units per layer, else ``enc_self 3, enc_ffn 40``."""
    values = set(counts.values())
    return str(values.pop()) if len(values) == 1 else ", ".join(f"{g} {c}" for g, c in counts.items())


def layout_search(layout: str = "global"):
    """The cost-aware search of a layout: ``mask_search.search_mask`` (global) or ``uniform_search``."""
    from headprune.selection.mask_search import search_mask

    return search_mask if check_layout(layout) == "global" else uniform_search
