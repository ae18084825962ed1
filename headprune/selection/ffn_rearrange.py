"""Mask rearrangement for FFN neurons (Kwon et al. 2022): keep each block's neuron count, re-choose which neurons go."""

import torch

from headprune.scoring.importance import per_example_gate_gradients, per_example_loss
from headprune.selection.greedy import check_groups
from headprune.selection.rearrange import Rearrangement


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


def rearrange_ffn_layer(mask_row: torch.Tensor, grads: torch.Tensor, present: torch.Tensor | None = None) -> torch.Tensor:
    """A mask row keeping as many neurons as ``mask_row`` whose removed set has a form no larger (absent neurons stay removed)."""
    grads = grads.detach().cpu().double()
    width = grads.shape[1]
    present = torch.ones(width, dtype=torch.bool) if present is None else present.detach().cpu().bool()
    removed = (mask_row.detach().cpu() == 0).double()
    if bool((removed[~present] == 0).any()):
        raise ValueError("the mask keeps a neuron that is absent from the model's weights: pass gates.present() and a mask removing them")
    free = present.nonzero().flatten().tolist()
    n_free = int(removed[present].sum())
    if n_free in (0, len(free)):
        return mask_row.detach().cpu().clone()
    new = (~present).double()
    new[greedy_removed_set(grads, free, n_free)] = 1.0
    tolerance = 1e-12 * max(gradient_form(removed, grads), 1e-300)
    better = gradient_form(new, grads) < gradient_form(removed, grads) - tolerance
    return (1 - (new if better else removed)).to(mask_row.dtype)


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
        for layer in range(out[g].shape[0]):
            out[g][layer] = rearrange_ffn_layer(out[g][layer], g_grads[:, layer], None if present is None else present[g][layer])
        forms = lambda m: torch.tensor([gradient_form((m[l] == 0).double(), g_grads[:, l]) for l in range(m.shape[0])])  # noqa: E731
        before[g], after[g] = forms(mask[g].detach().cpu()), forms(out[g])
    return Rearrangement(out, before, after, {g: [False] * out[g].shape[0] for g in groups})
