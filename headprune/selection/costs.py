"""Cost models for cost-aware pruning: a fixed cost plus, per attention layer, its cost with n heads kept.

    cost(mask) = fixed + sum_layers table[layer, heads kept in that layer]

``flops_cost_model`` fills the tables analytically with the same formulas as ``counting.model_cost``
(so a prediction equals ``model_cost`` of the physically pruned model, phantom head included);
``headprune.selection.latency`` fills them with measured seconds. Everything outside attention is fixed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from headprune.core.counting import model_cost
from headprune.core.gates import find_sites
from headprune.core.projections import in_features, out_features

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

    # ---- JSON --------------------------------------------------------------------------------
    def as_dict(self) -> dict:
        return {"unit": self.unit, "fixed": self.fixed, "tables": {g: t.tolist() for g, t in self.tables.items()}, "info": self.info or {}}

    @classmethod
    def from_dict(cls, data: dict) -> CostModel:
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
    def load(cls, path: str | Path) -> CostModel:
        return cls.from_dict(json.loads(Path(path).read_text()))


def head_flops(site, seq_len: int) -> int:
    """Forward FLOPs of one head of an attention module: its q/k/v rows, output columns and scores."""
    projections = sum(in_features(site.linear(w)) for w in ("query", "key", "value")) + out_features(site.linear("output"))
    return 2 * seq_len * site.head_dim * projections + 2 * 2 * seq_len * seq_len * site.head_dim  # q k^T and probs @ v


def flops_cost_model(model: nn.Module, seq_len: int = 128) -> CostModel:
    """Analytic FLOPs per example of ``seq_len`` tokens; a layer with no head left still runs its zero phantom head."""
    sites = find_sites(model)
    whole = model_cost(model, seq_len)
    shape: dict[str, tuple[int, int]] = {}
    for site in sites:
        layers, heads = shape.get(site.group, (0, 0))
        shape[site.group] = (max(layers, site.layer + 1, site.stack_layers), max(heads, site.num_heads_orig))
    tables = {g: torch.zeros(layers, heads + 1, dtype=torch.float64) for g, (layers, heads) in shape.items()}
    for site in sites:
        kept = torch.arange(site.num_heads_orig + 1).clamp(min=1)  # 0 heads kept = the phantom head
        tables[site.group][site.layer, : site.num_heads_orig + 1] = kept.double() * head_flops(site, seq_len)
    return CostModel("flops", float(whole.flops - whole.attention_flops), tables, info={"seq_len": seq_len})


def kv_group_flops(site, seq_len: int) -> int:
    """Forward FLOPs of one KV group of a grouped-query attention module: its query heads, their KV head and scores."""
    n = site.heads_per_kv
    rows = n * in_features(site.linear("query")) + in_features(site.linear("key")) + in_features(site.linear("value"))
    return 2 * seq_len * site.head_dim * (rows + n * out_features(site.linear("output"))) + 2 * 2 * seq_len * seq_len * site.head_dim * n


def kv_group_flops_cost_model(model: nn.Module, seq_len: int = 128) -> CostModel:
    """Analytic FLOPs per example with tables in KV groups ({group: [layers, KV heads + 1]}), for ``prune.unit=kv_group``.

    A layer keeping k >= 1 KV groups computes k KV heads and their k * heads_per_kv query heads; with none left it
    runs the zero phantom (one query head over one KV head), as ``headprune.core.pruning`` leaves it.
    """
    sites = find_sites(model)
    whole = model_cost(model, seq_len)
    shape: dict[str, tuple[int, int]] = {}
    for site in sites:
        layers, kv = shape.get(site.group, (0, 0))
        shape[site.group] = (max(layers, site.layer + 1, site.stack_layers), max(kv, site.num_kv_heads_orig))
    tables = {g: torch.zeros(layers, kv + 1, dtype=torch.float64) for g, (layers, kv) in shape.items()}
    for site in sites:
        kept = torch.arange(site.num_kv_heads_orig + 1).double() * kv_group_flops(site, seq_len)
        kept[0] = head_flops(site, seq_len)  # the phantom: one query head, one KV head
        tables[site.group][site.layer, : site.num_kv_heads_orig + 1] = kept
    return CostModel("flops", float(whole.flops - whole.attention_flops), tables, info={"seq_len": seq_len, "unit": "kv_group"})
