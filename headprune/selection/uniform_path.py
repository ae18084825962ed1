"""The uniform layout's search path: the per-layer counts removed, level by level, and their costs without building masks."""

import torch

from headprune.core.unit_kinds import kind_of_group


def part_of(group: str) -> str:
    """The parts of the model a group prunes, as one key (``attention``, ``feed_forward``, ``attention+feed_forward`` ...)."""
    return "+".join(kind_of_group(group).parts)


class UniformPath:
    """Unit orders and counts of one uniform search: which units a level removes and what it costs."""

    def __init__(self, scores: dict[str, torch.Tensor], costs, base: dict[str, torch.Tensor], groups: list[str], floor: int):
        self.costs, self.base, self.groups, self.floor = costs, base, groups, floor
        self.shape = costs.groups
        self.scores = {g: scores[g].detach().double().cpu() for g in groups}
        low = min(float(s.min()) for s in self.scores.values())
        self.scores = {g: s - low if low < 0 else s for g, s in self.scores.items()}  # score / cost needs a common zero
        self.gone = {g: (base[g] == 0).sum(-1).long().tolist() for g in groups}  # (L,) removed in the start mask
        self.tables = {g: t.tolist() for g, t in costs.tables.items()}
        self.base_kept = {g: base[g].ne(0).sum(-1).long().tolist() for g in costs.tables}
        self.orders = {}  # (group, layer): kept units, lowest score first (ties: the lower id)
        self.values = {g: self.scores[g].tolist() for g in groups}
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
