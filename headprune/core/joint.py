"""Any number of kinds under one mask: each group of a joint mask goes to the part (one kind's gates) that holds it."""

import torch
from torch import nn

from headprune.core.kinds.kind_registry import JOINER
from headprune.core.site_gates import SharedGates


def shared_gates(gates) -> dict:
    """{kind name: the gates that act} under any gates: a joint or block gates' parts, or the gates themselves."""
    shared = getattr(gates, "shared", None)
    return dict(shared) if shared is not None else {gates.unit: gates}


class JointGates(SharedGates):
    """The gates of several kinds of one model behind one surface: masks and scores are {group: [layers, units]} over all."""

    def __init__(self, model: nn.Module, parts: list):
        """``parts``: one gates object per kind, of different groups."""
        if not parts:
            raise ValueError("JointGates needs at least one part (one gates object per kind)")
        self.model = model
        self.parts = list(parts)
        self.unit = JOINER.join(part.unit for part in self.parts)  # the kinds' names joined: head+ffn, kv_group+ffn+hidden ...
        self.shared = {name: gates for part in self.parts for name, gates in shared_gates(part).items()}  # {kind name: the gates that act}
        self.heads, self.ffn = self.shared.get("head"), self.shared.get("ffn")  # HeadGates, FFNGates where a part acts on them
        self.groups = {g: shape for part in self.parts for g, shape in part.groups.items()}  # (layers, units per layer originally)
        self._owner = {g: part for part in self.parts for g in part.groups}

    def __getattr__(self, name):  # inner, kv_groups, heads_per_kv, describe ...: the query-head gates' own structure
        heads = self.__dict__.get("heads")
        if heads is None:
            raise AttributeError(name)
        return getattr(heads, name)

    def present(self) -> dict[str, torch.Tensor]:
        return {g: p for part in self.parts for g, p in part.present().items()}

    def split(self, mask) -> list[dict]:
        """One dict per part: the groups of a joint mask that part holds; a group of none is a ValueError naming them all."""
        if not isinstance(mask, dict):
            raise ValueError(f"a joint mask is a dict {{group: tensor}} over the groups {sorted(self._owner)}")
        unknown = sorted(set(mask) - set(self._owner))
        if unknown:
            have = " and ".join(f"the {part.unit} groups {sorted(part.groups)}" for part in self.parts)
            raise ValueError(f"unknown group(s) {unknown} in mask; this model has {have}")
        return [{g: m for g, m in mask.items() if self._owner[g] is part} for part in self.parts]

    def normalize_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        return {g: m for part, sub in zip(self.parts, self.split(mask)) for g, m in part.normalize_mask(sub, hard=hard).items()}

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{kind that acts: its mask} of a joint mask (parts it leaves out are absent)."""
        out: dict[str, dict[str, torch.Tensor]] = {}
        for part, sub in zip(self.parts, self.split(mask)):
            if sub:
                for kind, value in part.base_masks(sub, hard=hard).items():
                    out.setdefault(kind, {}).update(value)
        return out

    def scores_from_heads(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Scores in this unit from per-query-head scores of the attention groups (other groups' scores as they are)."""
        out = dict(scores)
        for part in self.parts:
            convert = getattr(part, "scores_from_heads", None)
            if convert is not None:
                out.update(convert({g: s for g, s in scores.items() if g in part.groups}))
        return out
