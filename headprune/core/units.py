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
from headprune.core.unit_kinds import KINDS, unit_kinds, unit_name

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


def _kv_view(heads):
    if not has_kv_groups(heads):
        raise ValueError(
            "prune.unit=kv_group needs grouped-query attention (fewer KV heads than query heads); "
            f"this model has one KV head per query head ({heads.groups}): use prune.unit=head"
        )
    return KVGroupGates(heads)


def primitive_gates(gates):
    """(HeadGates, FFNGates or None) under any gates: the gates that act on the model."""
    from headprune.core.ffn_gates import FFNGates
    from headprune.core.gates import HeadGates

    if isinstance(gates, HeadGates):
        return gates, None
    if isinstance(gates, FFNGates):
        return None, gates
    return getattr(gates, "heads", None), getattr(gates, "ffn", None)


def unit_gates(gates, unit: str = "head"):
    """The gates of ``gates`` (any gates of a model, or the model itself) in ``unit`` (a kind or a joint list, see the module doc).

    The query-head and neuron gates already on the model are reused; a ValueError names an unknown unit or a
    ``kv_group`` unit on a model without grouped-query attention.
    """
    from headprune.core.blocks import BlockGates
    from headprune.core.ffn_gates import FFNGates
    from headprune.core.gates import HeadGates
    from headprune.core.joint import JointGates

    try:
        kinds = unit_kinds(unit)
    except ValueError as err:
        raise ValueError(f"pruning unit must be one of {list(KINDS)} or a joint list such as [head, ffn]: {err}") from None
    if not isinstance(gates, nn.Module) and not isinstance(getattr(gates, "model", None), nn.Module):
        raise TypeError(
            f"unit_gates takes a model (torch nn.Module) or gates on one (HeadGates, FFNGates, ...) and a unit, "
            f"got {type(gates).__name__} {gates!r:.40}"
        )
    if isinstance(gates, nn.Module):
        model, heads, ffn = gates, None, None
    else:
        heads, ffn = primitive_gates(gates)
        model = gates.model
    if kinds == ("head",) and isinstance(gates, HeadGates):
        return gates
    needs_heads = any("attention" in KINDS[k].parts for k in kinds)
    heads = heads if heads is not None or not needs_heads else HeadGates(model)
    needs_ffn = any("ffn" in KINDS[k].parts for k in kinds) and kinds != ("block",)
    ffn = ffn if ffn is not None or not needs_ffn else FFNGates(model)
    name = unit_name(kinds)
    if name == "head":
        return heads
    if name == "kv_group":
        return _kv_view(heads)
    if name == "ffn":
        return ffn
    if name == "block":
        return BlockGates(model, heads=heads, ffn=ffn)
    return JointGates(model, heads=heads if "head" in kinds else _kv_view(heads), ffn=ffn)


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
    """A mask in the unit of ``gates`` as the masks that act, in one dict: {attention group: [..., L, H], FFN group: [..., L, W]}."""
    base = _removing(gates.base_masks(mask, hard=hard), "the head and neuron masks of a mask")
    return {**base.get("head", {}), **base.get("ffn", {})}


def prune_unit_mask(gates, mask) -> dict:
    """Remove from the weights every unit whose entry of ``mask`` (in the unit of ``gates``) is 0: heads, KV groups, neurons
    or whole blocks (an emptied block keeps one zero phantom head or neuron). Returns {"heads": record, "ffn": record}."""
    from headprune.core.ffn_pruning import ffn_record, prune_ffn_mask
    from headprune.core.ffn_sites import ffn_sites_if_any
    from headprune.core.pruning import prune_mask, pruning_record

    base = _removing(gates.base_masks(mask, hard=True), "pruning removes units from the weights")
    batched = [g for part in base.values() for g, m in part.items() if m.dim() != 2]
    if batched:
        raise ValueError(f"pruning takes one [layers, units] mask per group, got a batch of masks for {batched}")
    model = gates.model
    heads = prune_mask(model, base["head"]) if base.get("head") else pruning_record(model)
    neurons = prune_ffn_mask(model, base["ffn"]) if base.get("ffn") else (ffn_record(model) if ffn_sites_if_any(model) else {})
    return {"heads": heads, "ffn": neurons}
