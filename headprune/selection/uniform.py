"""The uniform layout: every layer of a group loses the same number of units (heads or KV groups)."""

import math
from collections.abc import Callable
from functools import partial

import torch

from headprune.core.unit_kinds import kind_of_group
from headprune.selection.greedy import Head, check_fractions, check_groups, greedy_mask, n_to_prune, ranked_heads
from headprune.selection.mask_search import SearchPath, SearchResult, nonnegative, search_mask, start_mask

LAYOUTS = ("global", "uniform")


def check_layout(layout: str) -> str:
    """The layout name, or a ValueError listing the known ones."""
    if layout not in LAYOUTS:
        raise ValueError(f"prune.layout must be one of {list(LAYOUTS)}, got {layout!r}")
    return layout


def uniform_counts(fraction: float, shape: dict[str, tuple[int, int]], groups: list[str], min_per_layer: int = 0) -> dict[str, int]:
    """{group: units removed per layer}: floor(fraction x units per layer), at most units - max(min_per_layer, 1)."""
    return {g: min(int(math.floor(fraction * shape[g][1] + 1e-9)), shape[g][1] - max(min_per_layer, 1)) for g in groups}


def uniform_mask(
    scores: dict[str, torch.Tensor], shape: dict[str, tuple[int, int]], counts: dict[str, int], start: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """``start`` (or all ones) with the lowest-scoring units of every layer removed until ``counts[group]`` are gone per layer."""
    mask = start_mask(shape, start)
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


def uniform_path(scores: dict[str, torch.Tensor], costs, start, min_per_layer: int, groups) -> SearchPath:
    """``search_mask``'s path for the uniform layout: the uniform counts (every layer of the chosen groups) of ``levels``."""
    shape = costs.groups
    groups = check_groups(groups, shape)
    base = start_mask(shape, start)
    path = UniformPath(scores, costs, base, groups, max(min_per_layer, 1))
    levels = path.levels()
    last = set(levels[-1].values())  # one count when every group removes as many units per layer, else "enc_self 3, enc_ffn 40"
    removing = str(last.pop()) if len(last) == 1 else ", ".join(f"{g} {c}" for g, c in levels[-1].items())
    where = f"in the uniform layout with min_per_layer={min_per_layer}: removing {removing} units in every layer"

    def removed(mask: dict[str, torch.Tensor], level: int) -> list[Head]:
        """The units ``mask`` removes beyond the start mask, lowest score first (the order of a SearchResult)."""
        new = [(g, l, h) for g in groups for l, h in ((mask[g] == 0) & (base[g] != 0)).nonzero().tolist()]
        return sorted(new, key=lambda u: (float(scores[u[0]][u[1], u[2]]), groups.index(u[0]), u[1], u[2]))

    return SearchPath(
        lambda i: uniform_mask(scores, shape, levels[i], base),
        [path.cost(counts) for counts in levels],
        removed,
        (where, "; use prune.layout=global or a lower target"),
        lambda mask: sum(int((mask[g] == 0).sum()) for g in groups),  # scores kept by the units removed
    )


def layout_search(layout: str = "global") -> Callable[..., SearchResult]:
    """The cost-aware search of a layout: ``mask_search.search_mask`` along the greedy order (global) or ``uniform_path``."""
    return search_mask if check_layout(layout) == "global" else partial(search_mask, path=uniform_path)


def part_of(group: str) -> str:
    """The parts of the model a group prunes, as one key (``attention``, ``feed_forward``, ``attention+feed_forward`` ...)."""
    return "+".join(kind_of_group(group).parts)


class UniformPath:
    """Unit orders and counts of one uniform search: which units a level removes and what it costs."""

    def __init__(self, scores: dict[str, torch.Tensor], costs, base: dict[str, torch.Tensor], groups: list[str], floor: int):
        self.costs, self.base, self.groups, self.floor = costs, base, groups, floor
        self.shape = costs.groups
        self.gone = {g: (base[g] == 0).sum(-1).long().tolist() for g in groups}  # (L,) removed in the start mask
        self.tables = {g: t.tolist() for g, t in costs.tables.items()}
        self.base_kept = {g: base[g].ne(0).sum(-1).long().tolist() for g in costs.tables}
        self.orders = {}  # (group, layer): kept units, lowest score first (ties: the lower id)
        # score / cost needs a common zero
        self.values = {g: s.tolist() for g, s in nonnegative({g: scores[g].detach().cpu() for g in groups}).items()}
        for g in groups:
            values = self.values[g]
            for layer in range(self.shape[g][0]):
                alive = base[g][layer].nonzero().flatten().tolist()
                self.orders[g, layer] = sorted(alive, key=lambda h, row=values[layer]: (row[h], h))

    def cap(self, group: str) -> int:
        """The largest count removed per layer of ``group``."""
        return self.shape[group][1] - self.floor

    def _extra(self, group: str, layer: int, count: int) -> int:
        """Units a count removes in one layer beyond the start mask's."""
        return min(max(count - self.gone[group][layer], 0), len(self.orders[group, layer]))

    def cost(self, counts: dict[str, int]) -> float:
        """The cost model's cost of the uniform mask of ``counts`` (``costs.cost`` of that mask)."""
        total = self.costs.fixed
        for group, table in self.tables.items():
            for layer, row in enumerate(table):
                kept = self.base_kept[group][layer]
                if group in counts:
                    kept -= self._extra(group, layer, counts[group])
                total += row[kept]
        return total

    def score_between(self, group: str, low: int, high: int) -> float:
        """The scores of the units that counts ``low`` -> ``high`` newly remove from every layer of ``group``."""
        total = 0.0
        for layer in range(self.shape[group][0]):
            units = self.orders[group, layer][self._extra(group, layer, low) : self._extra(group, layer, high)]
            total += sum(self.values[group][layer][h] for h in units)
        return total

    def levels(self) -> list[dict[str, int]]:
        """The counts of every level, from the start mask's to the last (see the module doc)."""
        parts: dict[str, list[str]] = {}
        for g in self.groups:
            parts.setdefault(part_of(g), []).append(g)
        level = {p: max(max(self.gone[g] or [0]) for g in gs) for p, gs in parts.items()}
        top = {p: max(self.cap(g) for g in gs) for p, gs in parts.items()}
        counts = lambda lv: {g: min(lv[p], self.cap(g)) for p, gs in parts.items() for g in gs}  # noqa: E731
        path = [counts(level)]
        if len(parts) == 1:
            (p,) = parts
            return path + [counts({p: k}) for k in range(level[p] + 1, top[p] + 1)]
        cost = self.cost(path[-1])
        while True:
            best = None
            for index, p in enumerate(parts):
                if level[p] >= top[p]:
                    continue
                step = counts({**level, p: level[p] + 1})
                saving = cost - self.cost(step)
                if saving <= 0:
                    continue
                score = sum(self.score_between(g, path[-1][g], step[g]) for g in parts[p])
                key = (score / saving, index)
                if best is None or key < best[0]:
                    best = (key, p, step, cost - saving)
            if best is None:
                return path
            _, p, step, cost = best
            level[p] += 1
            path.append(step)
