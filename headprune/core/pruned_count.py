"""The FLOPs of a model pruned by a mask, counted on a weightless copy pruned the same way: what the pruned model's own
``model_cost`` says, for every kind and every joint unit (kinds multiply where they meet: a projection that keeps half
its heads' rows and half its residual columns costs a quarter)."""

import copy
import itertools
from collections.abc import Callable

import torch
from torch import nn

from headprune.core.counting import model_cost


class PrunedCount:
    """``count(mask)``: forward FLOPs per example of ``seq_len`` tokens of the model pruned by ``mask`` (in ``unit``), exactly;
    with ``measure``, what it says of the pruned model instead (``counting.model_bytes``: the weight bytes a token reads)."""

    def __init__(self, model: nn.Module, unit, seq_len: int = 128, measure: Callable[[nn.Module], float] | None = None):
        from headprune.core.units import unit_gates

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
        from headprune.core.units import prune_unit_mask, unit_gates

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
