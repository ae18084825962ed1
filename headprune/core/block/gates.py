"""Whole blocks as the unit: one gate per layer on its attention block and one on its feed-forward block."""

import torch
from torch import nn

from headprune.core.attention.gates import HeadGates
from headprune.core.ffn.gates import FFNGates
from headprune.core.site_gates import SharedGates


def block_group(group: str) -> str:
    """The block group (a layer's whole sub-block) of an attention or FFN group: ``dec_ffn`` -> ``dec_ffn_block``."""
    return group + "_block"


class BlockGates(SharedGates):
    """A gate on each layer's attention block and feed-forward block: masks and scores are {"<group>_block": [layers, 1]}."""

    unit = noun = "block"

    def __init__(self, model: nn.Module, heads: HeadGates, ffn: FFNGates | None):
        """``heads``: the model's query-head gates; ``ffn``: its neuron gates (None where it has no MLP layout)."""
        self.model, self.heads, self.ffn = model, heads, ffn

    @property
    def shared(self) -> dict:
        """{"head": HeadGates, "ffn": FFNGates}: the gates that act (no FFN gates where the model has no MLP layout)."""
        return {"head": self.heads} if self.ffn is None else {"head": self.heads, "ffn": self.ffn}

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """{"<group>_block": (layers, 1)} of every attention and FFN group."""
        return {block_group(g): (layers, 1) for part in self.shared.values() for g, (layers, _) in part.groups.items()}

    def present(self) -> dict[str, torch.Tensor]:
        """{"<group>_block": bool [layers, 1]}: True where the block still holds a head or a neuron."""
        return {block_group(g): p.any(-1, keepdim=True) for part in self.shared.values() for g, p in part.present().items()}

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{"head": head mask, "ffn": neuron mask}: every head and neuron of a block gated by the block's value."""
        mask = self.normalize_mask(mask, hard=hard)
        out: dict[str, dict[str, torch.Tensor]] = {}
        for kind, part in self.shared.items():
            for group, (_, units) in part.groups.items():  # the units' own groups
                if (value := mask.get(block_group(group))) is not None:
                    out.setdefault(kind, {})[group] = value.expand(*value.shape[:-1], units)
        return out
