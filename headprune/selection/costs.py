"""Cost models for cost-aware pruning: a fixed cost plus, per attention layer, its cost with n heads kept."""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from headprune.core.counting import model_cost
from headprune.core.flops_tables import head_flops, head_flops_tables, kv_group_flops, kv_group_flops_tables  # noqa: F401

UNITS = ("flops", "seconds")


@dataclass
class CostModel:
    """Forward cost of one example (or batch) as a function of the heads kept in each attention layer."""

    unit: str  # "flops" or "seconds"
    fixed: float  # everything that does not depend on the heads (embeddings, feed-forward, classifier, ...)
    tables: dict[str, torch.Tensor]  # {group: [layers, heads + 1]}: cost of layer l's attention with n heads kept
    info: dict | None = None  # how the tables were made (sequence length, device, ...)

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
        return self.fixed + sum(float(t[:, -1].sum()) for t in self.tables.values())

    def kept_counts(self, mask) -> dict[str, torch.Tensor]:
        """{group: [layers] long} heads kept per layer; groups missing from ``mask`` keep every head."""
        counts = {}
        for group, (layers, heads) in self.groups.items():
            value = mask.get(group) if mask is not None else None
            counts[group] = torch.full((layers,), heads) if value is None else (torch.as_tensor(value) != 0).sum(-1).long().cpu()
        return counts

    def cost(self, mask) -> float:
        """Predicted cost of the model pruned by ``mask`` ({group: 0/1 [layers, heads]})."""
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
        """What removing one more head saves in a layer that keeps ``kept`` heads."""
        table = self.tables[group]
        return float(table[layer, kept] - table[layer, kept - 1])

    def as_dict(self) -> dict:
        return {"unit": self.unit, "fixed": self.fixed, "tables": {g: t.tolist() for g, t in self.tables.items()}, "info": self.info or {}}

    @classmethod
    def from_dict(cls, data: dict) -> "CostModel":
        missing = {"unit", "fixed", "tables"} - set(data)
        if missing:
            raise ValueError(f"a cost model needs the keys unit, fixed and tables; missing {sorted(missing)}")
        return cls(unit=data["unit"], fixed=float(data["fixed"]), tables=data["tables"], info=data.get("info"))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.as_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> "CostModel":
        return cls.from_dict(json.loads(Path(path).read_text()))


def flops_cost_model(model: nn.Module, seq_len: int = 128) -> CostModel:
    """Analytic FLOPs per example of ``seq_len`` tokens; a layer with no head left still runs its zero phantom head."""
    whole = model_cost(model, seq_len)
    tables = head_flops_tables(model, seq_len)
    return CostModel("flops", float(whole.flops - whole.attention_flops), tables, info={"seq_len": seq_len})


def kv_group_flops_cost_model(model: nn.Module, seq_len: int = 128) -> CostModel:
    """Analytic FLOPs per example with tables in KV groups ({group: [layers, KV heads + 1]}), for ``prune.unit=kv_group``."""
    whole = model_cost(model, seq_len)
    tables = kv_group_flops_tables(model, seq_len)
    return CostModel("flops", float(whole.flops - whole.attention_flops), tables, info={"seq_len": seq_len, "unit": "kv_group"})
