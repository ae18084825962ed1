"""Mask rearrangement (Kwon et al. 2022), counts kept: heads by their Fisher blocks (rearrange.py), FFN neurons by per-example gradients."""

import torch

from headprune.core.unit_kinds import kind_of_group, kinds_of
from headprune.scoring.importance import per_example_gate_gradients, per_example_loss
from headprune.selection.greedy import check_groups
from headprune.selection.rearrange import Rearrangement, rearrange_mask


def example_gradients(model, gates, batches, loss_fn=per_example_loss, unit: str = "ffn", mask=None) -> dict[str, torch.Tensor]:
    """{group: (N, L, U)} signed per-example gate gradients over every example of ``batches`` (what rearrange_ffn_mask takes)."""
    parts = [per_example_gate_gradients(model, gates, batch, loss_fn=loss_fn, mask=mask, unit=unit) for batch in batches]
    if not parts:
        raise ValueError("example_gradients got no batches: the importance subset is empty")
    return {g: torch.cat([p[g] for p in parts]) for g in parts[0]}


def gradient_form(removed: torch.Tensor, grads: torch.Tensor) -> float:
    """||G 1_R||^2 / N of one layer: ``removed`` 0/1 [W], ``grads`` G (N, W) per-example gate gradients."""
    return float((grads @ removed.to(grads.dtype)).pow(2).sum() / max(grads.shape[0], 1))


def greedy_removed_set(grads: torch.Tensor, candidates: list[int], count: int) -> list[int]:
    """``count`` of ``candidates`` whose gradients sum to a small norm, by Kwon et al.'s greedy swap pass."""
    if count <= 0:
        return []
    g = grads[:, candidates].t().contiguous()  # (C, N)
    order = g.pow(2).sum(1).argsort(stable=True).tolist()  # lowest diagonal first
    chosen = order[:count]
    total = g[chosen].sum(0)  # (N,)
    for index in order[count:]:
        members = chosen + [index]
        total = total + g[index]
        left = (total[None, :] - g[members]).pow(2).sum(1)  # form without each member, (count + 1,)
        drop = int(left.argmin())
        total = total - g[members[drop]]
        del members[drop]
        chosen = members
    return [candidates[i] for i in chosen]


def rearrange_ffn_mask(
    mask: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], groups=None, present: dict[str, torch.Tensor] | None = None
) -> Rearrangement:
    """Each FFN layer keeps its neuron count with the removed set of lower gradient form (``grads``: {group: (N, L, W)})."""
    groups = check_groups(groups, {g: tuple(m.shape) for g, m in mask.items()})
    out = {g: m.detach().cpu().clone() for g, m in mask.items()}
    before, after = {}, {}
    for g in groups:
        if g not in grads or tuple(grads[g].shape[1:]) != tuple(mask[g].shape):
            raise ValueError(
                f"rearrange_ffn_mask needs per-example gradients [examples, {', '.join(map(str, mask[g].shape))}] for group {g!r}, got "
                f"{list(grads[g].shape) if g in grads else 'none'}: compute them with importance.per_example_gate_gradients"
            )
        g_grads = grads[g].detach().cpu().double()
        for layer, row in enumerate(out[g]):  # the same count kept, a removed set of no larger form; absent neurons stay removed
            layer_grads = g_grads[:, layer]  # (N, W)
            alive = torch.ones(row.numel(), dtype=torch.bool) if present is None else present[g][layer].detach().cpu().bool()
            removed = (row == 0).double()
            if bool((removed[~alive] == 0).any()):
                raise ValueError(
                    "the mask keeps a neuron that is absent from the model's weights: pass gates.present() and a mask removing them"
                )
            free = alive.nonzero().flatten().tolist()
            n_free = int(removed[alive].sum())
            if n_free in (0, len(free)):
                continue  # nothing to choose
            new = (~alive).double()
            new[greedy_removed_set(layer_grads, free, n_free)] = 1.0
            tolerance = 1e-12 * max(gradient_form(removed, layer_grads), 1e-300)
            better = gradient_form(new, layer_grads) < gradient_form(removed, layer_grads) - tolerance
            out[g][layer] = (1 - (new if better else removed)).to(row.dtype)
        forms = lambda m: torch.tensor([gradient_form((m[l] == 0).double(), g_grads[:, l]) for l in range(m.shape[0])])  # noqa: E731
        before[g], after[g] = forms(mask[g].detach().cpu()), forms(out[g])
    return Rearrangement(out, before, after, {g: [False] * out[g].shape[0] for g in groups})


def rearrangement_refusal(unit) -> str | None:
    """Why ``unit`` has no rearrangement (a kind of it has none), else None."""
    return next((kind.rearrangement for kind in kinds_of(unit) if kind.rearrangement), None)


def fisher_blocks_of(grads: torch.Tensor) -> torch.Tensor:
    """The Fisher blocks [L, U, U] (mean over examples of g g^T) of per-example gradients (N, L, U)."""
    return torch.einsum("nlh,nlk->lhk", grads, grads) / max(grads.shape[0], 1)


RULES = {  # a kind's rearrange_by: how its groups are re-chosen, (mask, grads, groups, min_per_layer, present) -> Rearrangement
    "fisher_blocks": lambda mask, grads, groups, least, present: rearrange_mask(
        mask, {g: fisher_blocks_of(grads[g]) for g in groups if g in grads}, groups, least, present
    ),
    "gradients": lambda mask, grads, groups, least, present: rearrange_ffn_mask(mask, grads, groups, present),
}


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
