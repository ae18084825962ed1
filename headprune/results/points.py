"""What a pruning point is called: its method (order, rearrangement, recovery) and what it removed."""

from headprune.core.unit_kinds import KINDS, kind_of_group
from headprune.core.units import units_asked


def point_name(point: dict) -> str:
    """A point's name: its order, rearrangement and recovery (``fisher+rearrange+lsq``), ``unpruned`` or ``unpruned + same training``."""
    if point.get("control"):
        return "unpruned + same training"
    name = point["order"] + ("+rearrange" if point.get("rearranged") else "")
    return name if point["recovery"] == "none" else f"{name}+{point['recovery']}"


def recovery_steps(recovery: str) -> list[str]:
    """The steps of one recovery, run in turn: ``reconstruct+finetune`` -> [reconstruct, finetune]."""
    return recovery.split("+")


def fine_tuned(point: dict) -> bool:
    """Whether a pruned point's recovery ends in a fine-tune (``finetune``, ``reconstruct+finetune``); the control is not one."""
    return "finetune" in recovery_steps(str(point.get("recovery"))) and not point.get("control")


def units_removed(record: dict) -> int | None:
    """The units a step, point or speed record removed (``heads_pruned`` in files before schema version 2)."""
    return record.get("units_removed", record.get("heads_pruned"))


def units_total(record: dict, default: int | None = None) -> int | None:
    """The units a record counts from (``heads_total`` / ``total_heads`` in files before schema version 2), else ``default``."""
    return record.get("units_total") or record.get("heads_total") or record.get("total_heads") or default


def units_by_kind(mask: dict, unit=None) -> dict[str, dict[str, int]]:
    """{kind: {"removed": n, "total": n}} of a mask: what each kind of a (joint) unit lost."""
    return {kind: {"removed": removed, "total": total} for kind, (removed, total) in kind_counts(mask, unit).items()}


def what_was_removed(fraction: float, removed: int, total: int) -> dict:
    """``fraction_removed`` (of the units) and ``fraction_met``: whether it removed the floor(fraction x total) units asked, some if any."""
    asked = units_asked(fraction, total)
    met = removed == asked and (asked > 0 or fraction == 0)  # a fraction that rounds down to no unit is not met
    return {"fraction_removed": removed / total if total else 0.0, "fraction_met": met}


def removed_fraction(step: dict, default_total: int | None = None) -> float:
    """The fraction of the units a step removed: ``fraction_removed``, else removed / total (older files), else the fraction asked."""
    if step.get("fraction_removed") is not None:
        return float(step["fraction_removed"])
    total = units_total(step, default_total)
    if units_removed(step) is not None and total:
        return units_removed(step) / total
    return float(step["fraction"])


def percent(fraction: float) -> str:
    """``33%``; a fraction that rounds to 0% or 100% without being it shows a decimal (``0.4%``, ``99.6%``)."""
    text = f"{100 * fraction:.0f}%"
    if text in ("0%", "100%") and 0 < fraction < 1:
        text = f"{100 * fraction:.1f}%"
    return text


def fraction_met(step: dict, default_total: int | None = None) -> bool:
    """Whether a step removed the round(fraction x total) units asked: ``fraction_met``, else from its counts, else True."""
    if step.get("fraction_met") is not None:
        return bool(step["fraction_met"])
    total = units_total(step, default_total)
    if step.get("fraction") is None or units_removed(step) is None or not total:
        return True
    return units_removed(step) == int(round(float(step["fraction"]) * total))


def step_label(step: dict, default_total: int | None = None) -> str:
    """A step's label: the fraction asked when it removed that many units (``20%``), else what it removed (``0% (asked 10%)``)."""
    asked = step.get("fraction")
    if asked is not None and fraction_met(step, default_total):
        return percent(float(asked))
    label = percent(removed_fraction(step, default_total))
    return label if asked is None else f"{label} (asked {percent(float(asked))})"


def point_step(point: dict) -> str:
    """A Pareto point's step: a target as asked (``speedup=1.3``), a fraction by what it removed (``25% (asked 40%)``)."""
    if point.get("fraction") is None or units_removed(point) is None or not units_total(point):
        return str(point["step"])
    return step_label(point)


def kind_counts(mask: dict, unit=None) -> dict[str, tuple[int, int]]:
    """{kind: (units removed, units in all)} of a 0/1 mask {group: [[...]]} (JSON lists or tensors), in the registry's order."""
    counts: dict[str, tuple[int, int]] = {}
    for group, rows in mask.items():
        kind = kind_of_group(group, unit).name
        values = rows.flatten().tolist() if hasattr(rows, "flatten") else [v for row in rows for v in row]
        removed, total = counts.get(kind, (0, 0))
        counts[kind] = (removed + sum(1 for v in values if v == 0), total + len(values))
    return {k: counts[k] for k in KINDS if k in counts}


def kinds_label(mask: dict, unit=None) -> str:
    """What each kind of a mask lost: ``heads 25%, neurons 40%`` (one kind: ``heads 25%``)."""
    counts = kind_counts(mask, unit).items()
    return ", ".join(f"{KINDS[kind].noun}s {percent(removed / total if total else 0.0)}" for kind, (removed, total) in counts)


def relative_to(result, base) -> dict:
    """{"relative": ``result`` over ``base``}: by the score, or for a point scored through its own tokenizer by the measure
    that compares across tokenizers (LM: bits per byte; ``"relative_by"`` names it)."""
    by = (getattr(result, "tokenizer", None) or {}).get("compared_by")
    if by and by in (getattr(base, "measures", None) or {}):
        value, start = result.measures[by], base.measures[by]
        return {"relative": value / start if start else None, "relative_by": by}
    return {"relative": result.score / base.score if base.score else None}


def measures(result) -> dict:
    """A result's further measures beside its score (LM: bits_per_byte, perplexity_per_byte), each a field of the point."""
    return dict(getattr(result, "measures", None) or {})


def score_fields(result, base) -> dict:
    """A point's score beside ``base``: relative (per byte through its own tokenizer), its further measures, its tokenizer if its own."""
    tokenizer = getattr(result, "tokenizer", None)
    return {"score": result.score, **relative_to(result, base), **measures(result), **({"tokenizer": tokenizer} if tokenizer else {})}
