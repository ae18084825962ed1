"""Cost models for cost-aware pruning: a fixed cost plus, per attention layer, its cost with n heads kept."""

import bisect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from headprune.core.counting import head_flops_tables, model_cost

UNITS = ("flops", "seconds", "bytes")  # bytes: the weights one decoded token reads (unit_costs.unit_bytes_cost_model)


@dataclass
class CostModel:
    """Forward cost of one example (or batch) as a function of the heads kept in each attention layer."""

    unit: str  # "flops", "seconds" or "bytes"
    fixed: float  # everything that does not depend on the heads (embeddings, feed-forward, classifier, ...)
    tables: dict[str, torch.Tensor]  # {group: [layers, heads + 1]}: cost of layer l's attention with n heads kept
    info: dict | None = None  # how the tables were made (sequence length, device, ...)
    exact: Callable | None = field(default=None, repr=False, compare=False)  # mask -> the pruned model's own cost (core.units.PrunedCount)

    def __post_init__(self):
        if self.unit not in UNITS:
            raise ValueError(f"cost unit must be one of {UNITS}, got {self.unit!r}")
        self.tables = {g: torch.as_tensor(t, dtype=torch.float64) for g, t in self.tables.items()}

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """{group: (layers, heads)} the tables describe."""
        return {g: (t.shape[0], t.shape[1] - 1) for g, t in self.tables.items()}

    @property
    def total(self) -> float:
        """Cost with every head kept."""
        if self.exact is not None:
            return self.exact(None)
        return self.fixed + sum(float(t[:, -1].sum()) for t in self.tables.values())

    def kept_counts(self, mask) -> dict[str, torch.Tensor]:
        """{group: [layers] long} heads kept per layer; groups missing from ``mask`` keep every head."""
        counts = {}
        for group, (layers, heads) in self.groups.items():
            value = mask.get(group) if mask is not None else None
            counts[group] = torch.full((layers,), heads) if value is None else (torch.as_tensor(value) != 0).sum(-1).long().cpu()
        return counts

    def cost(self, mask) -> float:
        """Predicted cost of the model pruned by ``mask`` ({group: 0/1 [layers, heads]}): exact where ``exact`` counts it."""
        if self.exact is not None:
            try:
                return self.exact(mask)
            except ValueError:
                pass  # no model can be pruned by ``mask`` (every channel or layer gone): the tables' sum stands in
        return self.table_cost(mask)

    def table_cost(self, mask) -> float:
        """The tables' cost of ``mask``: the fixed cost plus each layer's row at its kept count (kinds added, not multiplied)."""
        total = self.fixed
        for group, kept in self.kept_counts(mask).items():
            table = self.tables[group]
            total += float(table[torch.arange(table.shape[0]), kept].sum())
        return total

    def kept_fraction(self, mask) -> float:
        """cost(mask) / cost with every head: for FLOPs, the fraction of the model's FLOPs kept."""
        return self.cost(mask) / self.total

    def speedup(self, mask) -> float:
        """Predicted speed-up total / cost(mask), non-attention costs counted as fixed."""
        return self.total / self.cost(mask)

    def saving(self, group: str, layer: int, kept: int) -> float:
        """What removing one more head saves in a layer that keeps ``kept`` heads (by the tables: the search's ranking)."""
        table = self.tables[group]
        return float(table[layer, kept] - table[layer, kept - 1])

    def as_dict(self) -> dict:
        return {"unit": self.unit, "fixed": self.fixed, "tables": {g: t.tolist() for g, t in self.tables.items()}, "info": self.info or {}}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        """The cost model ``save`` wrote to ``path``."""
        data = json.loads(Path(path).read_text())
        missing = {"unit", "fixed", "tables"} - set(data)
        if missing:
            raise ValueError(f"a cost model needs the keys unit, fixed and tables; missing {sorted(missing)}")
        return cls(unit=data["unit"], fixed=float(data["fixed"]), tables=data["tables"], info=data.get("info"))


def flops_cost_model(model: nn.Module, seq_len: int = 128) -> CostModel:
    """Analytic FLOPs per example of ``seq_len`` tokens; a layer with no head left still runs its zero phantom head."""
    whole = model_cost(model, seq_len)
    tables = head_flops_tables(model, seq_len)
    return CostModel("flops", float(whole.flops - whole.attention_flops), tables, info={"seq_len": seq_len})


class CostsAlong:
    """The exact costs of a path of masks (0..n units removed), each counted when first asked; cost never grows along it."""

    def __init__(self, costs: CostModel, mask_at: Callable[[int], dict], n: int):
        self.costs, self.mask_at, self.n, self.known = costs, mask_at, n, {}

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, k: int) -> float:
        k = k % self.n
        if k not in self.known:
            self.known[k] = self.costs.cost(self.mask_at(k))
        return self.known[k]


def first_meeting(cost_at, meets: Callable[[float], bool]) -> int | None:
    """The first index of ``cost_at`` (a list or a ``CostsAlong``) whose cost ``meets`` a bound; None: none does."""
    if not isinstance(cost_at, CostsAlong):
        return next((k for k, c in enumerate(cost_at) if meets(c)), None)
    if not meets(cost_at[len(cost_at) - 1]):
        return None
    # by bisection, counting few costs: a cost that meets the bound stays met further along (False ... False True ... True)
    return bisect.bisect_left(range(len(cost_at) - 1), True, key=lambda k: meets(cost_at[k]))
