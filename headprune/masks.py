"""Head masks: validation, and the heads a mask removes."""
from __future__ import annotations

import torch


def normalize_mask(mask, groups: dict[str, tuple[int, int]]) -> dict[str, torch.Tensor]:
    """Check a mask against ``groups`` ({group: (layers, heads)}) and return {group: float tensor}.

    A mask is a dict {group: [layers, heads] or [batch, layers, heads]}, or a bare tensor when the
    model has one group. Groups left out are not gated.
    """
    if isinstance(mask, torch.Tensor) or not isinstance(mask, dict):
        if len(groups) != 1:
            raise ValueError(
                f"this model has several attention groups {sorted(groups)}: give the mask as a dict "
                "{group: tensor [layers, heads]}"
            )
        mask = {next(iter(groups)): mask}
    out = {}
    for group, value in mask.items():
        if group not in groups:
            raise ValueError(f"unknown attention group {group!r} in mask; this model has {sorted(groups)}")
        value = torch.as_tensor(value, dtype=torch.float32) if not isinstance(value, torch.Tensor) else value
        layers, heads = groups[group]
        if value.dim() not in (2, 3) or tuple(value.shape[-2:]) != (layers, heads):
            raise ValueError(
                f"mask for group {group!r} has shape {tuple(value.shape)}; expected [{layers}, {heads}] "
                f"(layers x heads) or [batch, {layers}, {heads}] (one mask per example)"
            )
        out[group] = value.float() if not value.is_floating_point() else value
    return out


def head_list(mask: dict[str, torch.Tensor]) -> dict[str, dict[int, list[int]]]:
    """The heads a 0/1 mask removes: {group: {layer: [head ids]}}."""
    removed = {}
    for group, value in mask.items():
        for layer, head in (value == 0).nonzero().tolist():
            removed.setdefault(group, {}).setdefault(layer, []).append(head)
    return removed
