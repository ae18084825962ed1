"""Kept counts in multiples: a kind's per-layer counts round up to runtimes' tiles (``prune.ffn_multiple``), and a kind with one
width (the residual stream) keeps a multiple its stock config accepts (``prune.hidden_multiple``)."""

import torch

from headprune.core.unit_kinds import kind_of_group, kinds_of


def runtime_multiples(unit, settings) -> dict[str, int]:
    """{kind name: the multiple its per-layer kept counts round up to} from the prune settings (or {setting name: value})."""
    return {kind.name: multiple for kind in kinds_of(unit) if (multiple := kind.runtime_multiple(settings)) > 1}


def width_multiples(model, unit, settings) -> dict[str, int]:
    """{kind name: the multiple its kept count rounds to}: the kind's own rule (its config's), times the setting's (their lcm).

    ``settings``: the prune settings, or a mapping {setting name: value}; a setting at None leaves the kind's rule."""
    return {kind.name: multiple for kind in kinds_of(unit) if (multiple := kind.kept_multiple(model, settings)) > 1}


def _by_score(score: torch.Tensor, units: list[int]) -> list[int]:
    """``units`` of one layer's scores (U,), highest first (ties by id)."""
    return sorted(units, key=lambda n: (-float(score[n]), n))


def _rounded(mask: dict[str, torch.Tensor], scores: dict[str, torch.Tensor], multiples: dict[str, int], unit, want) -> dict:
    """``mask`` with each row of a kind in ``multiples`` keeping ``want(kept, width, multiple)`` units: the lowest-scored kept go, or the highest-scored removed come back; the other groups as they are."""
    out = {}
    for group, values in mask.items():
        rows = values.detach().clone().float()
        multiple = multiples.get(kind_of_group(group, unit).name, 1)
        if multiple > 1:
            score = scores[group].detach().float().cpu()
            for layer, row in enumerate(rows):
                kept, width = int((row > 0.5).sum()), row.numel()
                count = want(kept, width, multiple)
                alive = (row > 0.5).nonzero().flatten().tolist()
                removed = (row <= 0.5).nonzero().flatten().tolist()
                if count < kept:
                    row[_by_score(score[layer], alive)[count:]] = 0.0
                else:
                    row[_by_score(score[layer], removed)[: count - kept]] = 1.0
        out[group] = rows
    return out


def round_runtime_multiples(mask: dict[str, torch.Tensor], scores: dict[str, torch.Tensor], multiples: dict[str, int], unit):
    """``mask`` with every layer of a kind in ``multiples`` keeping a multiple of its units, rounded up (the removed units with
    the highest scores come back); an emptied layer stays empty (width 0 is a multiple of anything)."""
    if any(m < 1 for m in multiples.values()):
        raise ValueError(f"a width multiple is at least 1, got {multiples}")

    def want(kept, width, multiple):
        return min(width, -(-kept // multiple) * multiple) if kept else 0  # ceil to the multiple, at most the layer's width

    return _rounded(mask, scores, multiples, unit, want) if multiples else mask


def round_kept_widths(mask: dict[str, torch.Tensor], scores: dict[str, torch.Tensor], multiples: dict[str, int], unit, up: bool = False):
    """``mask`` with each row of a kind in ``multiples`` keeping a multiple of its units: rounded down (the lowest-scored kept
    units go too, so a FLOPs, speed-up or fraction target stays met) or ``up`` (the highest-scored removed come back, so a
    max_drop target stays met); a row below one multiple keeps one multiple, a row kept whole stays whole."""

    def want(kept, width, multiple):
        if kept == width:
            return kept  # the original width: the config it came from takes it
        return min(width, max(multiple, (-(-kept // multiple) if up else kept // multiple) * multiple))

    return _rounded(mask, scores, multiples, unit, want) if multiples else mask
