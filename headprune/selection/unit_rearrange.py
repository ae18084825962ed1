"""Mask rearrangement in any unit that has several units per layer: each kind by its own rule, counts kept (Kwon et al. 2022)."""

import torch

from headprune.core.unit_kinds import kind_of_group, kinds_of
from headprune.selection.ffn_rearrange import rearrange_ffn_mask
from headprune.selection.greedy import check_groups
from headprune.selection.rearrange import Rearrangement, rearrange_mask


def rearrangement_refusal(unit) -> str | None:
    """Why ``unit`` has no rearrangement (a kind of it has none), else None."""
    return next((kind.rearrangement for kind in kinds_of(unit) if kind.rearrangement), None)


def fisher_blocks_of(grads: torch.Tensor) -> torch.Tensor:
    """The Fisher blocks [L, U, U] (mean over examples of g g^T) of per-example gradients (N, L, U)."""
    return torch.einsum("nlh,nlk->lhk", grads, grads) / max(grads.shape[0], 1)


def by_fisher_blocks(mask, grads, groups, min_per_layer, present) -> Rearrangement:
    """A few units per layer: each layer re-chosen from its U x U Fisher block (Kwon et al.'s heads)."""
    return rearrange_mask(mask, {g: fisher_blocks_of(grads[g]) for g in groups if g in grads}, groups, min_per_layer, present)


def by_gradients(mask, grads, groups, min_per_layer, present) -> Rearrangement:
    """Many units per layer: re-chosen from the per-example gradients, no U x U block (Kwon et al.'s neurons)."""
    return rearrange_ffn_mask(mask, grads, groups, present)


RULES = {"fisher_blocks": by_fisher_blocks, "gradients": by_gradients}  # a kind's rearrange_by: how its groups are re-chosen


def rearrange_unit_mask(
    mask: dict[str, torch.Tensor],
    grads: dict[str, torch.Tensor],
    unit,
    groups=None,
    min_per_layer: int = 0,
    present: dict[str, torch.Tensor] | None = None,
) -> Rearrangement:
    """``mask`` with each layer of ``groups`` keeping its count of units, re-chosen by its kind's rule (see the module doc)."""
    refusal = rearrangement_refusal(unit)
    if refusal:
        raise ValueError(f"unit {unit!r} has no rearrangement: {refusal}")
    groups = check_groups(groups, {g: tuple(m.shape) for g, m in mask.items()})
    by = {g: kind_of_group(g, unit).rearrange_by or "fisher_blocks" for g in groups}
    unknown = sorted({rule for rule in by.values() if rule not in RULES})
    if unknown:
        raise ValueError(f"unknown rearrange_by {unknown} of unit {unit!r}: a kind's rearrange_by is one of {list(RULES)}")
    out = {g: m.detach().cpu().clone() for g, m in mask.items()}
    done = []
    for rule, rearrange in RULES.items():
        chosen = [g for g in groups if by[g] == rule]
        if chosen:
            done.append(rearrange(mask, grads, chosen, min_per_layer, present))
            out.update({g: done[-1].mask[g] for g in chosen})
    merged = lambda name: {g: v for part in done for g, v in getattr(part, name).items()}  # noqa: E731
    return Rearrangement(out, merged("before"), merged("after"), merged("exact"))
