"""Head orders and greedy pruning masks: which heads go first, and the mask at each fraction pruned."""

import math

import torch

from headprune.core.unit_kinds import KINDS, group_kind
from headprune.core.units import units_asked

Head = tuple[str, int, int]  # (group, layer, head)


def check_fractions(fractions) -> list[float]:
    """Sorted unique fractions, each in [0, 1), or a ValueError naming the bad one."""
    out = []
    for f in fractions:
        f = float(f)
        if not 0.0 <= f < 1.0 or math.isnan(f):
            raise ValueError(f"pruning fraction {f} is outside [0, 1): at least one head must stay")
        out.append(round(f, 6))
    if not out:
        raise ValueError("no pruning fractions given")
    return sorted(set(out))


def fraction_grid(step: float, stop: float = 0.9) -> list[float]:
    """0, step, 2*step, ... up to ``stop`` (inclusive), e.g. 0.1 -> [0, 0.1, ..., 0.9]."""
    if not 0.0 < float(step) < 1.0:
        raise ValueError(f"fraction step {step} must be in (0, 1)")
    n = int(math.floor(float(stop) / float(step) + 1e-9))
    return check_fractions([i * float(step) for i in range(n + 1)])


def check_groups(groups, shape: dict[str, tuple[int, int]]) -> list[str]:
    """The groups to prune (all of the model's when empty), or a ValueError naming an unknown one."""
    if not groups:
        return list(shape)
    groups = [str(g) for g in groups]
    unknown = [g for g in groups if g not in shape]
    if unknown:
        raise ValueError(f"unknown attention group(s) {unknown}; this model has {list(shape)}")
    return groups


def ranked_heads(scores: dict[str, torch.Tensor], groups: list[str]) -> list[Head]:
    """Heads of ``groups`` sorted by score ascending (ties broken by group, layer, head: deterministic); +inf: never removed."""
    heads = []
    for group in groups:
        value = scores[group].detach().float().cpu()
        kept = (value != math.inf).nonzero().tolist()  # +inf: its kind's floor (a special or base token)
        heads += [(float(value[layer, head]), groups.index(group), layer, head, group) for layer, head in kept]
    heads.sort(key=lambda t: t[:4])
    return [(g, l, h) for _, _, l, h, g in heads]


def random_scores(shape: dict[str, tuple[int, int]], seed: int) -> dict[str, torch.Tensor]:
    """A seeded random score per head (a random order)."""
    generator = torch.Generator().manual_seed(int(seed))
    return {g: torch.rand(l, h, generator=generator) for g, (l, h) in shape.items()}


def negated_scores(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Order scores pruning the highest ``values`` first: attention entropy (diffuse heads), ablation deltas (ablated - base)."""
    return {g: -torch.as_tensor(v, dtype=torch.float32) for g, v in values.items()}


def n_to_prune(fraction: float, shape: dict[str, tuple[int, int]], groups: list[str]) -> int:
    """How many heads a fraction means: of the heads in ``groups`` (the paper prunes a share of the total), rounded down."""
    return units_asked(fraction, sum(shape[g][0] * shape[g][1] for g in groups))


def group_floors(shape: dict[str, tuple[int, int]]) -> dict[str, int]:
    """{group: the fewest units it keeps in all}: its kind's floor (a layer stack or the residual stream keeps one; 0 for the rest)."""
    return {g: KINDS[kind].group_floor if (kind := group_kind(str(g))) else 0 for g in shape}


def layer_floors(shape, min_per_layer: int) -> dict[str, int]:
    """{group: the fewest units each of its layers keeps}: prune.min_units_per_layer where its kind takes that floor, else 0."""
    return {g: KINDS[kind].layer_floor(min_per_layer) if (kind := group_kind(str(g))) else min_per_layer for g in shape}


def greedy_mask(
    order: list[Head], shape: dict[str, tuple[int, int]], n_prune: int, min_per_layer: int = 0, start: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Mask heads in ``order`` until ``n_prune`` are masked in total (``start``'s zeros count), keeping >= min_per_layer per layer."""
    per_layer = layer_floors(shape, min_per_layer)
    heads = min((shape[g][1] for g in {group for group, _, _ in order} if per_layer[g]), default=None)
    if heads is not None and min_per_layer >= heads:
        raise ValueError(
            f"min_heads_per_layer={min_per_layer} keeps every head: the layers have {heads} heads, "
            f"so it must be at most {heads - 1} (0 = no floor)"
        )
    mask = {g: (start[g].clone().float() if start is not None else torch.ones(l, h)) for g, (l, h) in shape.items()}
    pruned = sum(int((m == 0).sum()) for m in mask.values())
    floors, kept = group_floors(shape), {g: int((m != 0).sum()) for g, m in mask.items()}
    for group, layer, head in order:
        if pruned >= n_prune:
            break
        if mask[group][layer, head] == 0:
            continue
        if int(mask[group][layer].sum()) - 1 < per_layer[group] or kept[group] - 1 < floors[group]:
            continue  # this layer, or its whole group, is at its floor: skip to the next head in the order
        mask[group][layer, head] = 0.0
        pruned += 1
        kept[group] -= 1
    return mask


def heads_removed(mask: dict[str, torch.Tensor]) -> int:
    """Number of zero entries of a mask."""
    return sum(int((m == 0).sum()) for m in mask.values())
