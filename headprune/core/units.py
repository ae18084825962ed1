"""Pruning units as one protocol: ``unit_gates(gates_or_model, unit)`` gives the gates whose masks and scores are in that unit.

    head            HeadGates                     {attention group: [layers, heads]}
    kv_group        KVGroupGates (a view)         {attention group: [layers, KV heads]}
    ffn             FFNGates                      {FFN group: [layers, neurons]}
    block           BlockGates                    {"<group>_block": [layers, 1]}
    head+ffn        JointGates                    attention and FFN groups side by side
    kv_group+ffn    JointGates over KVGroupGates  KV groups and FFN groups side by side

Every gates object has the same surface: ``unit``, ``groups``, ``ones``, ``present``, ``normalize_mask``, ``set_mask``,
``masked``, ``probing``, ``sites``, and ``base_masks(mask)``: the query-head and neuron masks that act
({"head": ..., "ffn": ...}), converted here, the one place, before any gate or pruning sees them.
``prune_unit_mask`` removes a mask of any unit from the weights.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from headprune.core.masks import kv_to_head_mask, normalize_mask
from headprune.core.unit_kinds import KINDS, kinds_of

QUERY_HEADS = "head"  # the unit every model has: its query heads
UNITS = (QUERY_HEADS, "kv_group")  # the attention units of prune.unit (single kinds: headprune.core.unit_kinds.KINDS)
FFN = "ffn"  # the intermediate neurons of the feed-forward blocks (headprune.core.ffn_gates.FFNGates)
JOINT = "head+ffn"  # heads and FFN neurons under one mask (headprune.core.joint.JointGates)
SCORED_UNITS = (*UNITS, FFN, JOINT, "kv_group+ffn", "block")  # the units the core gates, scores and prunes


class KVGroupGates:
    """HeadGates seen in KV-group units: masks and scores are {group: [layers, KV heads]}."""

    unit = "kv_group"

    def __init__(self, heads):
        self.heads = heads  # the HeadGates of the model (query-head unit)

    @property
    def shared(self) -> dict:
        """{"head": the query-head gates}: the gates that act."""
        return {"head": self.heads}

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

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{"head": the query-head mask of a KV-group mask}."""
        return {"head": self.head_mask(mask, hard=hard)}

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


def kv_group_view(heads):
    """The KV-group view of query-head gates, or a ValueError where the model has no grouped-query attention."""
    if not has_kv_groups(heads):
        raise ValueError(
            "prune.unit=kv_group needs grouped-query attention (fewer KV heads than query heads); "
            f"this model has one KV head per query head ({heads.groups}): use prune.unit=head"
        )
    return KVGroupGates(heads)


def primitive_gates(gates):
    """(HeadGates, FFNGates or None) under any gates: the query-head and neuron gates that act on the model."""
    from headprune.core.joint import shared_gates

    shared = shared_gates(gates)
    return shared.get("head"), shared.get("ffn")


def _model_and_shared(gates) -> tuple[nn.Module, dict]:
    """(the model, {kind name: gates already on it}) of a model or of any gates object; a TypeError for anything else."""
    from headprune.core.joint import shared_gates

    if isinstance(gates, nn.Module):
        return gates, {}
    if not isinstance(getattr(gates, "model", None), nn.Module):
        raise TypeError(f"unit_gates takes a model (torch.nn.Module) or a gates object of one, got {type(gates).__name__}")
    return gates.model, shared_gates(gates)


def unit_gates(gates, unit="head"):
    """The gates of ``gates`` (any gates of a model, or the model itself) in ``unit`` (a kind, a joint list or a ``+``-joined
    string, see headprune.core.kinds). The gates already on the model are reused; a ValueError names an unknown unit or a
    kind the model lacks (``kv_group`` without grouped-query attention)."""
    from headprune.core.joint import JointGates

    if unit is None or not isinstance(unit, (str, list, tuple)):
        raise TypeError(f"unit_gates takes a unit: a kind name such as 'head', or a list such as ['head', 'ffn'], got {unit!r}")
    try:
        kinds = kinds_of(unit)
    except ValueError as err:
        raise ValueError(f"pruning unit must be one of {list(KINDS)} or a joint list such as [head, ffn]: {err}") from None
    model, shared = _model_and_shared(gates)
    if len(kinds) == 1 and getattr(gates, "unit", None) == kinds[0].name:
        return gates
    parts = [kind.gates(model, shared) for kind in kinds]
    return parts[0] if len(parts) == 1 else JointGates(model, parts)


def unit_count(gates) -> int:
    """Units of the original model in the unit of ``gates``, all groups (heads, KV groups, neurons, blocks, or their sum)."""
    return sum(layers * units for layers, units in gates.groups.values())


STREAMING = (
    "a streaming mask (headprune.core.stream_gates.StreamGates) keeps every weight: a streamed unit still attends, to its "
    "sink and recent window only; it is no mask of heads or neurons that act or go"
)


def _removing(base: dict, what: str) -> dict:
    """The base masks of a mask that removes units; a ValueError for a streaming mask, which ``what`` cannot take."""
    if "stream" in base:
        raise ValueError(f"{what}: {STREAMING}")
    return base


def base_mask(gates, mask, hard: bool = False) -> dict[str, torch.Tensor]:
    """A mask in the unit of ``gates`` as the masks that act, in one dict: {attention group: [..., L, H], FFN group: [..., L, W], ...}."""
    base = _removing(gates.base_masks(mask, hard=hard), "the masks that act of a mask")
    return {group: value for part in base.values() for group, value in part.items()}


def prune_unit_mask(gates, mask) -> dict:
    """Remove from the weights every unit whose entry of ``mask`` (in the unit of ``gates``) is 0, each by the kind that acts
    on it (an emptied block keeps one zero phantom head or neuron). Returns {record key: record} (``heads``, ``ffn``, ...)."""
    base = _removing(gates.base_masks(mask, hard=True), "pruning removes units from the weights")
    batched = [g for part in base.values() for g, m in part.items() if m.dim() != 2]
    if batched:
        raise ValueError(f"pruning takes one [layers, units] mask per group, got a batch of masks for {batched}")
    model = gates.model
    pruned = [kind for kind in KINDS.values() if base.get(kind.name)]
    for kind in pruned:
        kind.prune(model, base[kind.name])
    records = {
        kind.record_key or kind.name: kind.record(model) for kind in pruned
    }  # after every kind: removed layers take their units along
    records.setdefault("heads", KINDS["head"].record(model))
    records.setdefault("ffn", KINDS["ffn"].record(model))
    return records
