"""FFN widths in multiples: every layer keeps a multiple of ``multiple`` neurons (``prune.ffn_multiple``)."""

import torch

from headprune.core.unit_kinds import kind_of_group


def round_ffn_widths(mask: dict[str, torch.Tensor], scores: dict[str, torch.Tensor], multiple: int, unit) -> dict[str, torch.Tensor]:
    """``mask`` with every FFN layer's kept neurons rounded up to a multiple of ``multiple``; the other groups as they are."""
    if multiple < 1:
        raise ValueError(f"an FFN width multiple is at least 1, got {multiple}")
    out = {}
    for group, values in mask.items():
        rows = values.detach().clone().float()
        if kind_of_group(group, unit).multiple_setting == "ffn_multiple" and multiple > 1:
            score = scores[group].detach().float().cpu()
            for layer, row in enumerate(rows):
                kept = int((row > 0.5).sum())
                if kept == 0:
                    continue  # an emptied FFN stays empty: width 0 is a multiple of anything
                want = min(row.numel(), -(-kept // multiple) * multiple)  # ceil to the multiple, at most the layer's width
                removed = (row <= 0.5).nonzero().flatten().tolist()
                back = sorted(removed, key=lambda n: (-float(score[layer, n]), n))[: want - kept]  # highest scores first
                row[back] = 1.0
        out[group] = rows
    return out
