"""Pruning units: a query head (``head``) or a KV group (``kv_group``: a KV head with all of its query heads).

``unit_gates(gates, unit)`` gives HeadGates themselves for ``head`` and a ``KVGroupGates`` view for
``kv_group``: its ``groups`` are the KV groups ({group: (layers, KV heads)}), its masks are KV-group masks,
converted to query-head masks (``kv_to_head_mask``) here, the one place, before any gate or pruning sees them.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from headprune.core.masks import kv_to_head_mask, normalize_mask

QUERY_HEADS = "head"  # the unit every model has: its query heads
UNITS = (QUERY_HEADS, "kv_group")  # the units prune.unit offers
FFN = "ffn"  # the intermediate neurons of the feed-forward blocks (headprune.core.ffn_gates.FFNGates)
JOINT = "head+ffn"  # heads and FFN neurons under one mask (headprune.core.joint.JointGates)
SCORED_UNITS = (*UNITS, FFN, JOINT)  # the units the core gates, scores and prunes


class KVGroupGates:
    """HeadGates seen in KV-group units: masks and scores are {group: [layers, KV heads]}."""

    unit = "kv_group"

    def __init__(self, heads):
        self.heads = heads  # the HeadGates of the model (query-head unit)

    def __getattr__(self, name):  # sites, inner, probing, kv_groups, describe, ...: the query-head gates' own
        return getattr(self.heads, name)

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """{group: (layers, KV heads per layer in the original model)}."""
        return self.heads.kv_groups

    @property
    def num_heads(self) -> int:
        """KV groups in the original model, all groups."""
        return sum(layers * kv for layers, kv in self.groups.values())

    def ones(self) -> dict[str, torch.Tensor]:
        return {g: torch.ones(l, k) for g, (l, k) in self.groups.items()}

    def present(self) -> dict[str, torch.Tensor]:
        """{group: bool [layers, KV heads]}: True where any query head of the KV group is still in the weights."""
        present = self.heads.present()
        n = self.heads.heads_per_kv
        return {g: p.unflatten(-1, (p.shape[-1] // n[g], n[g])).any(-1) for g, p in present.items()}

    def normalize_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """Check a KV-group mask against the model ({group: [L, KV] or [B, L, KV]})."""
        return normalize_mask(mask, self.groups, hard=hard)

    def head_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """The query-head mask of a KV-group mask: each KV group's gate on all of its query heads."""
        return kv_to_head_mask(self.normalize_mask(mask, hard=hard), self.heads.heads_per_kv)

    def scores_from_heads(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-KV-group scores from per-query-head scores {group: [L, H]}: the mean of each group's query heads."""
        n = self.heads.heads_per_kv
        return {g: s.unflatten(-1, (s.shape[-1] // n[g], n[g])).mean(-1) for g, s in scores.items()}

    def set_mask(self, mask) -> None:
        self.heads.set_mask(None if mask is None else self.head_mask(mask))

    @contextmanager
    def masked(self, mask):
        with self.heads.masked(None if mask is None else self.head_mask(mask)):
            yield self


def has_kv_groups(gates) -> bool:
    """Whether any attention group of the model shares KV heads among several query heads."""
    return any(n > 1 for n in gates.heads_per_kv.values())


def unit_gates(gates, unit: str = "head"):
    """The gates in ``unit``: HeadGates for ``head``, a KVGroupGates view for ``kv_group`` (models with grouped KV heads only)."""
    if unit not in UNITS:
        raise ValueError(f"pruning unit must be one of {UNITS}, got {unit!r}")
    if unit == "head":
        return gates
    if not has_kv_groups(gates):
        raise ValueError(
            "prune.unit=kv_group needs grouped-query attention (fewer KV heads than query heads); "
            f"this model has one KV head per query head ({gates.groups}): use prune.unit=head"
        )
    return KVGroupGates(gates)
