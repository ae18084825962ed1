"""A pruning-unit kind with weights of its own, written outside headprune: a rank-r branch beside each down projection.

``attach_lowrank(model, rank)`` gives every feed-forward block a branch ``b(a(h))`` (``a``: its neurons -> r, ``b``: r ->
the residual width) added to the down projection's output; a unit is one rank component (a row of ``a`` with its column
of ``b``). ``register_kind(LowRankKind())`` makes it a value of ``prune.unit``; its ``save_meta`` / ``restore`` pair lets
``save_pruned`` / ``load_pruned`` keep the branches, so a saved directory builds them again before its weights load.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from headprune.core.ffn.sites import ffn_sites_if_any
from headprune.core.kinds import KINDS, UnitKind
from headprune.core.masks import normalize_mask
from headprune.core.site_gates import SiteGates, broadcast_unit_gate

NAME = "lowrank"
SUFFIX = "_lowrank"  # its mask groups: "dec_ffn_lowrank" [layers, rank]
BRANCH = "lowrank"  # the branch's attribute on the feed-forward block (its weights: <block>.lowrank.a / .b)


class LowRankBranch(nn.Module):
    """``b(gate * a(h))`` over the kept rank components; also the site of their gates (group, layer, ids, gate, probes)."""

    def __init__(self, width: int, out: int, rank_ids: list[int], rank_orig: int, group: str, layer: int, stack_layers: int = 0):
        super().__init__()
        kept = max(len(rank_ids), 1)  # an emptied branch computes one zero phantom component
        self.a, self.b = nn.Linear(width, kept, bias=False), nn.Linear(kept, out, bias=False)
        self.rank_ids, self.rank_orig, self.group, self.layer, self.stack_layers = list(rank_ids), rank_orig, group, layer, stack_layers
        self.gate: torch.Tensor | None = None  # (R,) or (B, R) over the kept components
        self.probes: list[torch.Tensor] = []
        self.recording = False

    @property
    def unit_ids(self) -> list[int]:
        return self.rank_ids

    @property
    def units_orig(self) -> int:
        return self.rank_orig

    @property
    def has_units(self) -> bool:
        return bool(self.rank_ids)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        z = self.a(hidden)  # (B, T, R)
        if self.gate is not None:
            z = z * broadcast_unit_gate(self.gate, z)
        if self.recording and torch.is_grad_enabled():
            probe = torch.ones(z.shape, dtype=z.dtype, device=z.device, requires_grad=True)
            self.probes.append(probe)
            z = z * probe  # d loss / d probe[b, t, r] = component r's gate gradient at token t
        return self.b(z)  # (B, T, d)

    def keep(self, positions: list[int]) -> None:
        """Keep only the components at these positions of the weights (none: one zero phantom)."""
        index = torch.tensor(positions or [0], dtype=torch.long, device=self.a.weight.device)
        a, b = self.a.weight.data.index_select(0, index), self.b.weight.data.index_select(1, index)
        if not positions:
            a, b = a * 0, b * 0
        self.a, self.b = nn.Linear(a.shape[1], a.shape[0], bias=False), nn.Linear(b.shape[1], b.shape[0], bias=False)
        self.a.weight.data, self.b.weight.data = a, b
        self.rank_ids = [self.rank_ids[p] for p in positions]


def _add_branch(branch: LowRankBranch, down: nn.Module, args, output):
    """The forward hook on a down projection: its output plus the branch on the same input (a partial: a deep copy keeps its own)."""
    return output + branch(args[0])


def branches(model: nn.Module) -> list[LowRankBranch]:
    """The model's low-rank branches, by group and layer."""
    return [
        getattr(site.module, BRANCH) for site in ffn_sites_if_any(model) if isinstance(getattr(site.module, BRANCH, None), LowRankBranch)
    ]


def _hook(site, branch: LowRankBranch) -> None:
    site.module.add_module(BRANCH, branch)
    site.down().register_forward_hook(functools.partial(_add_branch, branch))


def attach_lowrank(model: nn.Module, rank: int, kept: dict | None = None, seed: int = 0) -> nn.Module:
    """Give every feed-forward block a rank-``rank`` branch beside its down projection (``kept``: {group: {layer: ids}} of a saved one)."""
    gen = torch.Generator().manual_seed(seed)
    for site in ffn_sites_if_any(model):
        down = site.down()
        ids = list(range(rank)) if kept is None else [int(i) for i in kept[site.group + SUFFIX][str(site.layer)]]
        branch = LowRankBranch(down.in_features, down.out_features, ids, rank, site.group + SUFFIX, site.layer, site.stack_layers)
        with torch.no_grad():
            branch.a.weight.copy_(torch.randn(branch.a.weight.shape, generator=gen) / down.in_features**0.5)
            branch.b.weight.copy_(torch.randn(branch.b.weight.shape, generator=gen) / rank**0.5)
        _hook(site, branch.to(down.weight.device, down.weight.dtype))
    return model


class LowRankGates(SiteGates):
    """Gates on every branch's rank components: {"<ffn group>_lowrank": [layers, rank]}."""

    unit = NAME
    noun = "rank component"

    def __init__(self, model: nn.Module):
        self.model = model

    @property
    def sites(self) -> list[LowRankBranch]:
        return branches(self.model)

    def describe(self) -> str:
        return f"{NAME} groups={self.groups}"


class LowRankKind(UnitKind):
    """Rank components of the low-rank branch beside each down projection."""

    name = NAME
    parts = ("feed_forward",)  # it reads the neurons: no joint unit with the ffn kind
    noun = "rank component"
    rearrangement = "its rank components have no rearrangement"
    floor_units = None
    rebuild_order = 100  # after the FFN widths: its branch reads the kept neurons
    gates_class = LowRankGates

    def owns(self, group: str) -> bool:
        return group.endswith(SUFFIX)

    def group_names(self, attention_groups):
        return [g + SUFFIX for g in KINDS["ffn"].group_names(attention_groups)]  # one branch per feed-forward block

    def available(self, model):
        return None if branches(model) else "this model has no low-rank branches: attach_lowrank(model, rank) first"

    def gates(self, model, shared):
        if NAME not in shared:
            shared[NAME] = LowRankGates(model)
        return shared[NAME]

    def unit_grad(self, site, grad):
        return (grad, site.rank_ids, site.group) if isinstance(site, LowRankBranch) else None

    def flops_tables(self, model, seq_len):
        # k components kept: a (W -> k) and b (k -> d), 2 FLOPs a multiply-add, per token
        gates = LowRankGates(model)
        tables = {g: torch.zeros(layers, units + 1, dtype=torch.float64) for g, (layers, units) in gates.groups.items()}
        for branch in branches(model):
            per_unit = 2 * seq_len * (branch.a.in_features + branch.b.out_features)
            tables[branch.group][branch.layer] = torch.arange(branch.rank_orig + 1, dtype=torch.float64) * per_unit
        return tables

    def prune(self, model, mask):
        mask = normalize_mask(mask, LowRankGates(model).groups, hard=True, unit=self.noun)
        for branch in branches(model):
            row = mask[branch.group][branch.layer]
            branch.keep([p for p, i in enumerate(branch.rank_ids) if row[i] != 0])
        return self.record(model)

    def record(self, model):
        return {b.group: {str(b.layer): [i for i in range(b.rank_orig) if i not in b.rank_ids]} for b in branches(model)}

    def save_meta(self, model):
        found = branches(model)
        if not found:
            return None
        kept: dict[str, dict[str, list[int]]] = {}
        for branch in found:
            kept.setdefault(branch.group, {})[str(branch.layer)] = branch.rank_ids
        return {"rank": found[0].rank_orig, "kept": kept}

    def restore(self, model, meta, path):
        if meta:
            attach_lowrank(model, int(meta["rank"]), kept=meta["kept"])  # the weights load over the random ones
