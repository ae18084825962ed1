"""Mask rearrangement (Kwon et al. 2022): keep each layer's head count, re-choose which heads go."""

import itertools
import math
from dataclasses import dataclass

import torch

from headprune.selection.greedy import check_groups

EXHAUSTIVE_LIMIT = 20000  # C(12, 6) = 924 sets: every BERT-sized layer is solved exactly


@dataclass
class Rearrangement:
    """The rearranged mask and, per group and layer, the quadratic form before and after and whether it is the optimum."""

    mask: dict[str, torch.Tensor]
    before: dict[str, torch.Tensor]  # {group: [layers]} (1 - m)^T F_l (1 - m) of the given mask
    after: dict[str, torch.Tensor]  # the same of the rearranged mask (<= before)
    exact: dict[str, list[bool]]  # True where the layer was searched exhaustively (after is its minimum)

    @property
    def layers_changed(self) -> int:
        """How many layers keep a different set of heads (a set changes only when its form falls)."""
        return sum(int(a < b) for g in self.before for b, a in zip(self.before[g].tolist(), self.after[g].tolist()))


def removed_form(removed: torch.Tensor, block: torch.Tensor) -> float:
    """(1 - m)^T F (1 - m) of one layer: ``removed`` = 1 - m as a 0/1 vector [H], ``block`` F [H, H]."""
    r = removed.to(block.dtype)
    return float(r @ block @ r)


def quadratic_form(mask: dict[str, torch.Tensor], blocks: dict[str, torch.Tensor], groups=None) -> dict[str, torch.Tensor]:
    """{group: [layers]} (1 - m_l)^T F_l (1 - m_l) of every layer; twice it approximates the loss increase of ``mask``."""
    groups = check_groups(groups, {g: tuple(b.shape[:2]) for g, b in blocks.items()})
    out = {}
    for g in groups:
        removed = 1 - mask[g].detach().cpu().to(blocks[g].dtype)  # (L, H)
        out[g] = torch.einsum("lh,lhk,lk->l", removed, blocks[g].cpu(), removed)
    return out


def _swaps(block: torch.Tensor, removed: torch.Tensor, free: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Best-improvement swaps (one removed free head for one kept free head) until none lowers 1_R^T F 1_R; returns R as 0/1 [H]."""
    removed = removed.clone()
    diag = block.diagonal()
    for _ in range(block.shape[0] ** 3 + 1):  # the form falls at every swap, so this bound is never reached in practice
        r = block @ removed  # (H,) r_x = sum_{k in R} F[x, k]
        # form(R - i + j) - form(R) = -2 r_i + F_ii + 2 (r_j - F_ij) + F_jj
        delta = (-2 * r + diag)[:, None] + (2 * r + diag)[None, :] - 2 * block  # (H, H) [i removed, j kept]
        allowed = ((removed > 0) & free)[:, None] & ((removed == 0) & free)[None, :]
        delta = delta.masked_fill(~allowed, math.inf)
        best = int(delta.argmin())
        i, j = divmod(best, block.shape[0])
        if not float(delta[i, j]) < -tolerance:
            return removed
        removed[i], removed[j] = 0.0, 1.0
    return removed


def rearrange_layer(
    mask_row: torch.Tensor, block: torch.Tensor, present: torch.Tensor | None = None, exhaustive_limit: int = EXHAUSTIVE_LIMIT
) -> tuple[torch.Tensor, bool]:
    """(mask row with the same count kept and a form <= the given one, whether that form is the layer's minimum)."""
    block = block.detach().cpu().double()
    heads = block.shape[0]
    present = torch.ones(heads, dtype=torch.bool) if present is None else present.detach().cpu().bool()
    removed = (mask_row.detach().cpu() == 0).double()  # (H,)
    if bool((removed[~present] == 0).any()):
        raise ValueError(
            "the mask keeps a head that is absent from the model's weights: pass the model's gates.present() "
            "and a mask that removes those heads"
        )
    free = [h for h in range(heads) if present[h]]
    n_free = int(removed[present].sum())
    tolerance = 1e-12 * max(float(block.diagonal().abs().max()), 1e-300)
    if n_free in (0, len(free)):
        return mask_row.detach().cpu().clone(), True  # nothing to choose
    if math.comb(len(free), n_free) > exhaustive_limit:
        return (1 - _swaps(block, removed, present, tolerance)).to(mask_row.dtype), False
    # every removed set, the absent heads and n_free of the free ones: the first of minimal form 1_R^T F 1_R (lexicographic order)
    sets = torch.tensor(list(itertools.combinations(free, n_free)), dtype=torch.long)  # (C, n_free), 0 < n_free < len(free)
    absent = torch.tensor([h for h in range(heads) if not present[h]], dtype=torch.long)
    sets = torch.cat([absent.expand(len(sets), -1), sets], 1)  # (C, n_removed)
    values = block[sets[:, :, None], sets[:, None, :]].sum((1, 2))  # (C,)
    best = torch.zeros(heads, dtype=torch.float64)
    best[sets[int(values.argmin())]] = 1.0
    chosen = best if removed_form(best, block) < removed_form(removed, block) - tolerance else removed  # ties keep the given mask
    return (1 - chosen).to(mask_row.dtype), True


def rearrange_mask(
    mask: dict[str, torch.Tensor],
    blocks: dict[str, torch.Tensor],
    groups=None,
    min_per_layer: int = 0,
    present: dict[str, torch.Tensor] | None = None,
    exhaustive_limit: int = EXHAUSTIVE_LIMIT,
) -> Rearrangement:
    """Each layer of ``groups`` keeps as many heads as in ``mask`` but the set whose removal minimises its Fisher block's form."""
    groups = check_groups(groups, {g: tuple(m.shape) for g, m in mask.items()})
    for g in groups:
        if g not in blocks or tuple(blocks[g].shape) != (*mask[g].shape, mask[g].shape[-1]):
            raise ValueError(
                f"rearrange_mask needs a Fisher block [layers, heads, heads] = "
                f"[{', '.join(map(str, (*mask[g].shape, mask[g].shape[-1])))}] for group {g!r}, got "
                f"{list(blocks[g].shape) if g in blocks else 'none'}: compute them with unit_rearrange.fisher_blocks_of"
            )
        kept = mask[g].detach().cpu().ne(0).sum(-1)
        if bool((kept < min_per_layer).any()):
            raise ValueError(
                f"the mask keeps fewer than min_per_layer={min_per_layer} heads in a layer of {g!r} "
                f"({kept.tolist()}); rearrangement keeps each layer's count, so fix the mask first"
            )
    out = {g: m.detach().cpu().clone() for g, m in mask.items()}
    exact = {}
    for g in groups:
        rows = [
            rearrange_layer(row, blocks[g][layer], None if present is None else present[g][layer], exhaustive_limit)
            for layer, row in enumerate(out[g])
        ]
        out[g], exact[g] = torch.stack([row for row, _ in rows]), [flag for _, flag in rows]
    return Rearrangement(out, quadratic_form(mask, blocks, groups), quadratic_form(out, blocks, groups), exact)
