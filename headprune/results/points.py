"""What a pruning point is called: its method (order, rearrangement, recovery) and what it removed."""

from __future__ import annotations


def point_name(point: dict) -> str:
    """``fisher+lsq``, ``fisher+rearrange+lsq``, ``importance``, ``unpruned``, ``unpruned + same training`` (the control):
    the order, its rearrangement and its recovery."""
    if point.get("control"):
        return "unpruned + same training"
    name = point["order"] + ("+rearrange" if point.get("rearranged") else "")
    return name if point["recovery"] == "none" else f"{name}+{point['recovery']}"


def removed_fraction(step: dict, units_total: int | None = None) -> float:
    """The fraction of the pruning units a step (or point) removed: ``fraction_removed``, else heads_pruned / total (older
    files), else the fraction asked."""
    if step.get("fraction_removed") is not None:
        return float(step["fraction_removed"])
    total = step.get("heads_total") or units_total
    if step.get("heads_pruned") is not None and total:
        return step["heads_pruned"] / total
    return float(step["fraction"])


def percent(fraction: float) -> str:
    """``33%``; a fraction that rounds to 0% or 100% without being it shows a decimal (``0.4%``, ``99.6%``)."""
    text = f"{100 * fraction:.0f}%"
    if text in ("0%", "100%") and 0 < fraction < 1:
        text = f"{100 * fraction:.1f}%"
    return text


def step_label(step: dict, units_total: int | None = None) -> str:
    """A step labelled by what it removed (``25%``), with the fraction asked beside it when that could not be met
    (``0% (asked 10%)``)."""
    removed = removed_fraction(step, units_total)
    asked = step.get("fraction")
    label = percent(removed)
    if asked is not None and percent(float(asked)) != label:
        label += f" (asked {percent(float(asked))})"
    return label
