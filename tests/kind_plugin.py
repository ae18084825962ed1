"""A pruning-unit kind written outside headprune, as a user would: each FFN block's two halves of neurons as two units.

It registers with ``register_kind(FFNHalfKind())`` and acts through headprune's own neuron gates, so its masks become
neuron masks (``base_masks``) that the FFN kind gates, scores and removes.
"""

from __future__ import annotations

import torch

from headprune.core.ffn.sites import FFNSite
from headprune.core.kinds import KINDS, UnitKind
from headprune.core.masks import normalize_mask

SUFFIX = "_half"


class FFNHalfGates:
    """The neuron gates seen in halves: masks and scores are {"<ffn group>_half": [layers, 2]}."""

    unit = "ffn_half"

    def __init__(self, ffn):
        self.ffn, self.model = ffn, ffn.model

    @property
    def shared(self) -> dict:
        return {"ffn": self.ffn}

    @property
    def sites(self) -> list:
        return self.ffn.sites

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        return {g + SUFFIX: (layers, 2) for g, (layers, _) in self.ffn.groups.items()}

    def ones(self) -> dict[str, torch.Tensor]:
        return {g: torch.ones(layers, 2) for g, (layers, _) in self.groups.items()}

    def present(self) -> dict[str, torch.Tensor]:
        return {g + SUFFIX: p.unflatten(-1, (2, -1)).any(-1) for g, p in self.ffn.present().items()}

    def normalize_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        return normalize_mask(mask, self.groups, hard=hard, unit="half")

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        widths = {g: w for g, (_, w) in self.ffn.groups.items()}
        mask = self.normalize_mask(mask, hard=hard)
        return {"ffn": {g[: -len(SUFFIX)]: m.repeat_interleave(widths[g[: -len(SUFFIX)]] // 2, -1) for g, m in mask.items()}}

    def set_mask(self, mask) -> None:
        self.ffn.set_mask(None if mask is None else self.base_masks(mask)["ffn"])

    def masked(self, mask):
        return self.ffn.masked(None if mask is None else self.base_masks(mask)["ffn"])

    def probing(self):
        return self.ffn.probing()

    def remove(self) -> None:
        self.ffn.remove()

    def describe(self) -> str:
        return self.ffn.describe()


class FFNHalfKind(UnitKind):
    """Each feed-forward block's first and second half of neurons."""

    name = "ffn_half"
    parts = ("feed_forward",)
    noun = "half"
    config_fields = ("intermediate_size",)
    rearrangement = "two units per layer leave nothing to re-choose"
    recovery_parts = ("feed_forward",)
    gates_class = FFNHalfGates
    floor_units = None

    def owns(self, group: str) -> bool:
        return group.endswith(SUFFIX) and KINDS["ffn"].owns(group[: -len(SUFFIX)])

    def gates(self, model, shared):
        return FFNHalfGates(KINDS["ffn"].gates(model, shared))

    def units_per_layer(self, fields):
        return 2

    def unit_grad(self, site, grad):
        if not isinstance(site, FFNSite):
            return None
        halves = torch.tensor(site.neuron_ids, device=grad.device) // (site.width_orig // 2)  # the half of each present neuron
        summed = grad.new_zeros(*grad.shape[:2], 2).index_add_(2, halves, grad)  # (B, T, 2)
        return summed, [0, 1], site.group + SUFFIX

    def flops_tables(self, model, seq_len):
        neurons = KINDS["ffn"].flops_tables(model, seq_len)
        return {g + SUFFIX: t[:, [0, (t.shape[1] - 1) // 2, t.shape[1] - 1]] for g, t in neurons.items()}

    def covered_flops(self, cost):
        return cost.ffn_flops

    def latency_tables(self, head_tables, ffn_tables, model):
        return {g + SUFFIX: t[:, [0, (t.shape[1] - 1) // 2, t.shape[1] - 1]] for g, t in ffn_tables.items()}

    def prune(self, model, mask):
        neurons = self.gates(model, {}).base_masks(mask, hard=True)["ffn"]  # each half as its neurons
        return KINDS["ffn"].prune(model, neurons)
