"""What every kind's gates object provides (``Gates``): the one surface code outside core/ reads, whatever the kind."""

from contextlib import AbstractContextManager
from typing import Protocol

import torch
from torch import nn


class Gates(Protocol):
    """The gates of one kind (or several, joined) on a model: masks and scores are {group: [layers, units]} or [batch, layers, units]."""

    model: nn.Module  # the model they gate
    unit: str  # the kind's name ("head+ffn" for joint gates)

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """{group: (layers, units per layer in the original model)}."""

    @property
    def sites(self) -> list:
        """The sites whose units they gate (each with group, layer, gate and probes)."""

    def ones(self) -> dict[str, torch.Tensor]:
        """A mask that keeps every unit."""

    def present(self) -> dict[str, torch.Tensor]:
        """{group: bool [layers, units]}: True where a unit is still in the weights."""

    def normalize_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """The mask checked against the model ({group: [L, U] or [B, L, U]}; ``hard``: 0/1 only), or a ValueError."""

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{name of the kind whose gates act: its mask}: what a mask in this unit sets on the gates that act."""

    def set_mask(self, mask) -> None:
        """Gate every unit by ``mask`` (``None``: no gates)."""

    def masked(self, mask) -> AbstractContextManager:
        """A block of code run with ``mask`` set, the previous gates restored afterwards."""

    def probing(self) -> AbstractContextManager:
        """A block of code whose forwards record per-token gate probes (gate gradients after backward)."""

    def remove(self) -> None:
        """Clear every gate."""

    def describe(self) -> str:
        """A short summary of the groups."""


METHODS = tuple(name for name, value in vars(Gates).items() if callable(value) and not name.startswith("_"))
ATTRIBUTES = (*Gates.__annotations__, *(name for name, value in vars(Gates).items() if isinstance(value, property)))


def missing_members(gates) -> list[str]:
    """The members of ``Gates`` that a gates object lacks; of a gates class, the methods it lacks (attributes may be set per object)."""
    if isinstance(gates, type):
        return [name for name in METHODS if not callable(getattr(gates, name, None))]
    return [name for name in (*ATTRIBUTES, *METHODS) if not hasattr(gates, name)]
