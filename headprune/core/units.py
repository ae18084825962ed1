"""Pruning units as one protocol: ``unit_gates(gates_or_model, unit)`` gives the gates whose masks and scores are in that unit."""

import copy
import itertools
import math
import warnings
from collections.abc import Callable

import torch
from torch import nn

from headprune.core.counting import model_cost
from headprune.core.joint import JointGates, shared_gates
from headprune.core.unit_kinds import KINDS, kinds_of, mask_kinds

QUERY_HEADS = "head"  # the unit every model has: its query heads
FFN = "ffn"  # the intermediate neurons of the feed-forward blocks (headprune.core.ffn.gates.FFNGates)


def primitive_gates(gates):
    """(HeadGates, FFNGates or None) under any gates: the query-head and neuron gates that act on the model."""
    shared = shared_gates(gates)
    return shared.get("head"), shared.get("ffn")


def _model_and_shared(gates) -> tuple[nn.Module, dict]:
    """(the model, {kind name: gates already on it}) of a model or of any gates object; a TypeError for anything else."""
    if isinstance(gates, nn.Module):
        return gates, {}
    if not isinstance(getattr(gates, "model", None), nn.Module):
        raise TypeError(
            f"unit_gates takes a model (torch nn.Module) or gates on one (HeadGates, FFNGates, ...) and a unit, "
            f"got {type(gates).__name__} {gates!r:.40}"
        )
    return gates.model, shared_gates(gates)


def unit_gates(gates, unit="head"):
    """The gates of ``gates`` (any gates of a model, or the model) in ``unit`` (a kind or a joint unit), reusing the gates on the model."""
    try:
        kinds = kinds_of(unit)
    except ValueError as err:
        raise ValueError(f"pruning unit must be one of {list(KINDS)} or a joint list such as [head, ffn]: {err}") from None
    model, shared = _model_and_shared(gates)
    if len(kinds) == 1 and getattr(gates, "unit", None) == kinds[0].name:
        return gates
    parts = [kind.gates(model, shared) for kind in kinds]
    return parts[0] if len(parts) == 1 else JointGates(model, parts)


def refit_gates(model: nn.Module, unit) -> list:
    """The gates least-squares recovery rescales after ``unit``'s units go: for each of its kinds' ``recovery_parts``, in order
    (query heads first), the gates of the first registered kind that prunes that part alone (query heads, FFN neurons)."""
    model, shared = _model_and_shared(model)
    parts = dict.fromkeys(part for kind in kinds_of(unit) for part in kind.recovery_parts)
    return [next(kind for kind in KINDS.values() if kind.parts == (part,)).gates(model, shared) for part in parts]


def model_gates(model: nn.Module):
    """The gates a task holds on a model: its query heads' (every model has attention); other units are views of them (``unit_gates``)."""
    return unit_gates(model, QUERY_HEADS)


def query_heads_of(gates, mask, hard: bool = False) -> dict[str, torch.Tensor]:
    """What a mask in the unit of ``gates`` sets on each query head: {attention group: [..., L, H]}, {} where it gates none."""
    base = gates.base_masks(mask, hard=hard)  # checks the mask
    return base.get(QUERY_HEADS, base.get("stream", {}))  # streaming gates' alphas are per query head too


def _removing(base: dict, what: str) -> dict:
    """The base masks of a mask that removes units; a ValueError for a streaming mask, which ``what`` cannot take."""
    if "stream" in base:
        raise ValueError(
            f"{what}: a streaming mask (headprune.core.stream_gates.StreamGates) keeps every weight: a streamed unit still attends, "
            "to its sink and recent window only; it is no mask of heads or neurons that act or go"
        )
    return base


def base_mask(gates, mask, hard: bool = False) -> dict[str, torch.Tensor]:
    """A mask in the unit of ``gates`` as the masks that act, in one dict: {attention group: [..., L, H], FFN group: [..., L, W], ...}."""
    base = _removing(gates.base_masks(mask, hard=hard), "the masks that act of a mask")
    return {group: value for part in base.values() for group, value in part.items()}


def prune_unit_mask(gates, mask) -> dict:
    """Remove from the weights every unit whose entry of ``mask`` (in the unit of ``gates``) is 0; returns {record key: record}."""
    parts = getattr(gates, "parts", None)
    if parts is not None and isinstance(mask, dict):  # a joint mask that leaves a kind out keeps all of its units: say so
        missing = [part for part in parts if not set(part.groups) & set(mask)]
        if missing:
            named = "; ".join(f"{part.unit}: {sorted(part.groups)}" for part in missing)
            warnings.warn(f"the {gates.unit} mask holds no group of {named}: every one of those units is kept", UserWarning, stacklevel=2)
    base = _removing(gates.base_masks(mask, hard=True), "pruning removes units from the weights")
    batched = [g for part in base.values() for g, m in part.items() if m.dim() != 2]
    if batched:
        raise ValueError(f"pruning takes one [layers, units] mask per group, got a batch of masks for {batched}")
    model = gates.model
    pruned = [kind for kind in KINDS.values() if base.get(kind.name)]
    for kind in pruned:
        kind.prune(model, base[kind.name])
    # recorded after every kind pruned: removed layers take their units along
    records = {kind.record_key or kind.name: kind.record(model) for kind in pruned}
    records.setdefault("heads", KINDS["head"].record(model))
    records.setdefault("ffn", KINDS["ffn"].record(model))
    return records


def prune_joint_mask(model: nn.Module, mask) -> dict:
    """Remove the units whose entries of a joint mask are 0, each group by the kind that owns it; returns the pruning record."""
    return prune_unit_mask(unit_gates(model, mask_kinds(mask)), mask)


def units_asked(fraction: float, total: int) -> int:
    """The whole units a fraction of ``total`` asks: rounded down, never more than asked."""
    # selection.greedy.check_fractions keeps 6 decimals: 0.833333 of 6 asks 5
    return math.floor(fraction * total + 5e-7 * total + 1e-9)


class PrunedCount:
    """``count(mask)``: forward FLOPs per example of ``seq_len`` tokens of the model pruned by ``mask`` (in ``unit``), exactly, on a
    weightless copy pruned the same way (kinds multiply where they meet: half the heads' rows and half the residual columns of a
    projection cost a quarter); with ``measure``, what it says of the pruned model instead (``counting.model_bytes``: the weight bytes a token reads)."""

    def __init__(self, model: nn.Module, unit, seq_len: int = 128, measure: Callable[[nn.Module], float] | None = None):
        memo: dict[int, torch.Tensor] = {}  # a deep copy whose tensors live on the meta device (shapes only), ties kept
        for tensor in itertools.chain(model.parameters(), model.buffers()):
            if id(tensor) not in memo:
                empty = torch.empty_like(tensor, device="meta")
                memo[id(tensor)] = nn.Parameter(empty, requires_grad=tensor.requires_grad) if isinstance(tensor, nn.Parameter) else empty
        self.template, self.unit, self.seq_len = copy.deepcopy(model, memo), unit, seq_len
        self.measure = measure or (lambda pruned: model_cost(pruned, seq_len).flops)
        self.groups = unit_gates(self.template, unit).groups
        self.known: dict[bytes, float] = {}

    def __call__(self, mask) -> float:
        """The FLOPs (or ``measure``) of the pruned model; a ValueError where no model can be pruned by ``mask`` (every channel, every layer gone)."""
        given = mask or {}  # as a hard 0/1 mask of every group: a group it leaves out keeps every unit
        full = {
            g: (torch.as_tensor(given[g]).detach().cpu() != 0).float() if g in given else torch.ones(layers, units)
            for g, (layers, units) in self.groups.items()
        }
        key = b"".join(full[g].bool().numpy().tobytes() for g in sorted(full))
        if key not in self.known:
            model = copy.deepcopy(self.template)  # meta tensors: a copy costs no memory
            if any(float(v.min()) == 0.0 for v in full.values()):
                prune_unit_mask(unit_gates(model, self.unit), full)
            self.known[key] = float(self.measure(model))
        return self.known[key]
