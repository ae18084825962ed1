"""Heads (or KV groups) and FFN neurons together: one mask {group: ...} whose attention groups gate heads or KV groups and
whose FFN groups gate neurons.

The attention groups (``enc_self``, ``enc_dec``, ``dec_self``) and the FFN groups (``enc_ffn``, ``dec_ffn``)
never share a name, so a joint mask is a plain dict holding both; each part goes to its own gates. The
attention part is HeadGates (unit ``head+ffn``) or their KV-group view (``kv_group+ffn``).
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch
from torch import nn

from headprune.core.ffn_gates import FFNGates
from headprune.core.ffn_pruning import prune_ffn_mask
from headprune.core.ffn_sites import ffn_groups, find_ffn_sites
from headprune.core.gates import HeadGates, find_sites, site_groups
from headprune.core.pruning import prune_mask, pruning_record
from headprune.core.unit_kinds import JOINER


def split_mask(mask, head_groups, ffn_groups) -> tuple[dict, dict]:
    """(head part, FFN part) of a joint mask dict; a group of neither kind is a ValueError naming them all."""
    if not isinstance(mask, dict):
        raise ValueError(
            f"a joint mask is a dict {{group: tensor}} over the attention groups {sorted(head_groups)} and the FFN groups {sorted(ffn_groups)}"
        )
    unknown = sorted(set(mask) - set(head_groups) - set(ffn_groups))
    if unknown:
        raise ValueError(
            f"unknown group(s) {unknown} in mask; this model has the attention groups {sorted(head_groups)} and the FFN groups {sorted(ffn_groups)}"
        )
    return {g: m for g, m in mask.items() if g in head_groups}, {g: m for g, m in mask.items() if g in ffn_groups}


class JointGates:
    """Attention gates (heads, or their KV-group view) and FFNGates of one model behind one surface: masks and scores are
    {group: [layers, units]} over both."""

    def __init__(self, model: nn.Module, heads=None, ffn: FFNGates | None = None):
        """``heads``: HeadGates, or ``KVGroupGates`` for the ``kv_group+ffn`` unit (default: HeadGates of the model)."""
        self.model = model
        self.attention = heads if heads is not None else HeadGates(model)  # the attention part, in its unit
        self.heads: HeadGates = self.attention if isinstance(self.attention, HeadGates) else self.attention.heads
        self.ffn = ffn if ffn is not None else FFNGates(model)

    @property
    def unit(self) -> str:
        """``head+ffn`` or ``kv_group+ffn``."""
        return self.attention.unit + JOINER + self.ffn.unit

    @property
    def sites(self) -> list:
        """Every attention site, then every FFN site."""
        return [*self.heads.sites, *self.ffn.sites]

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """{group: (layers, heads, KV groups or neurons per layer in the original model)}."""
        return {**self.attention.groups, **self.ffn.groups}

    # the query-head gates' structure, for code that reads it through any gates (engines, entropy, timing)
    @property
    def inner(self) -> str:
        return self.heads.inner

    @property
    def kv_groups(self) -> dict[str, tuple[int, int]]:
        return self.heads.kv_groups

    @property
    def heads_per_kv(self) -> dict[str, int]:
        return self.heads.heads_per_kv

    @property
    def num_heads(self) -> int:
        """Units of the original model, all groups (heads or KV groups, and neurons)."""
        return sum(layers * units for layers, units in self.groups.values())

    def present(self) -> dict[str, torch.Tensor]:
        return {**self.attention.present(), **self.ffn.present()}

    def ones(self) -> dict[str, torch.Tensor]:
        return {**self.attention.ones(), **self.ffn.ones()}

    def split(self, mask) -> tuple[dict, dict]:
        """(attention part, FFN part) of a joint mask."""
        return split_mask(mask, self.attention.groups, self.ffn.groups)

    def normalize_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        heads, neurons = self.split(mask)
        return {**self.attention.normalize_mask(heads, hard=hard), **self.ffn.normalize_mask(neurons, hard=hard)}

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{"head": query-head mask, "ffn": neuron mask} of a joint mask (parts it leaves out are absent)."""
        heads, neurons = self.split(mask)
        out = {}
        if heads:
            out["head"] = self.attention.head_mask(heads, hard=hard)
        if neurons:
            out["ffn"] = self.ffn.normalize_mask(neurons, hard=hard)
        return out

    def head_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """The query-head mask of the attention part of a joint mask."""
        return self.base_masks(mask, hard=hard).get("head", {})

    def scores_from_heads(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Scores in this unit from per-query-head scores of the attention groups (and neuron scores as they are)."""
        heads = {g: s for g, s in scores.items() if g in self.heads.groups}
        return {**scores, **self.attention.scores_from_heads(heads)}

    def set_mask(self, mask) -> None:
        """Gate heads and neurons by one mask; groups left out (or ``None``: all) are not gated."""
        heads, neurons = (None, None) if mask is None else self.split(mask)
        self.attention.set_mask(heads)
        self.ffn.set_mask(neurons)

    @contextmanager
    def masked(self, mask):
        heads, neurons = (None, None) if mask is None else self.split(mask)
        with self.attention.masked(heads), self.ffn.masked(neurons):
            yield self

    @contextmanager
    def probing(self):
        with ExitStack() as stack:
            stack.enter_context(self.heads.probing())
            stack.enter_context(self.ffn.probing())
            yield self

    def remove(self) -> None:
        self.ffn.remove()
        self.heads.remove()

    def describe(self) -> str:
        return self.heads.describe() + "\n" + self.ffn.describe()


def prune_joint_mask(model: nn.Module, mask) -> dict[str, dict[str, dict[str, list[int]]]]:
    """Remove the heads and the FFN neurons whose entries of a joint mask are 0; returns {"heads": record, "ffn": record}."""
    heads, neurons = split_mask(mask, site_groups(find_sites(model)), ffn_groups(find_ffn_sites(model)))
    head_record = prune_mask(model, heads) if heads else pruning_record(model)
    ffn_record = prune_ffn_mask(model, neurons)
    return {"heads": head_record, "ffn": ffn_record}
