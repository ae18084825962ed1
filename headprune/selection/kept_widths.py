"""Kept widths a stock config accepts: a kind with one width (the residual stream) keeps a multiple of its rule (``prune.hidden_multiple``)."""

import math

import torch

from headprune.core.unit_kinds import KINDS, group_kind, kinds_of


def width_multiples(model, unit, settings) -> dict[str, int]:
    """{kind name: the multiple its kept count rounds to}: the kind's own rule (its config's), times the setting's (their lcm).

    ``settings``: the prune settings, or a mapping {setting name: value}; a setting at None leaves the kind's rule."""
    out = {}
    for kind in kinds_of(unit):
        if kind.width_setting is None:
            continue
        given = settings.get(kind.width_setting) if isinstance(settings, dict) else getattr(settings, kind.width_setting, None)
        rule = kind.width_multiple(model)
        multiple = rule if given is None else math.lcm(rule, int(given))
        if multiple > 1:
            out[kind.name] = multiple
    return out


def round_kept_widths(mask: dict[str, torch.Tensor], scores: dict[str, torch.Tensor], multiples: dict[str, int], unit, up: bool = False):
    """``mask`` with each row of a kind in ``multiples`` keeping a multiple of its units: rounded down (the lowest-scored kept
    units go too, so a FLOPs, speed-up or fraction target stays met) or ``up`` (the highest-scored removed come back, so a
    max_drop target stays met); a row below one multiple keeps one multiple, a row kept whole stays whole."""
    if not multiples:
        return mask
    out = {}
    for group, values in mask.items():
        rows = values.detach().clone().float()
        multiple = multiples.get(KINDS[group_kind(str(group), unit)].name, 1)
        if multiple > 1:
            score = scores[group].detach().float().cpu()
            for layer, row in enumerate(rows):
                kept, width = int((row > 0.5).sum()), row.numel()
                if kept == width:
                    continue  # the original width: the config it came from takes it
                want = min(width, max(multiple, (-(-kept // multiple) if up else kept // multiple) * multiple))
                alive = (row > 0.5).nonzero().flatten().tolist()
                removed = (row <= 0.5).nonzero().flatten().tolist()
                by_score = lambda units: sorted(units, key=lambda n: (-float(score[layer, n]), n))  # noqa: E731 - highest first
                if want < kept:
                    row[by_score(alive)[want:]] = 0.0
                else:
                    row[by_score(removed)[: want - kept]] = 1.0
        out[group] = rows
    return out
