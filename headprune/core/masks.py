"""Masks of heads (and of FFN neurons): validation, and the units a mask removes."""

import torch


def _check_values(group: str, value: torch.Tensor, hard: bool, unit: str = "head") -> None:
    """Raise a ValueError naming the first NaN/inf entry (or, for a hard mask, the first entry not 0/1)."""
    bad = ~torch.isfinite(value)
    expected = "finite gate values"
    if hard:
        bad |= (value != 0) & (value != 1)
        expected = f"0 (remove the {unit}) or 1 (keep it)"
    if bad.any():
        where = bad.nonzero()[0].tolist()
        batch = f"example {where[0]}, " if len(where) == 3 else ""
        layer, head = where[-2:]
        found = value[tuple(where)].item()
        raise ValueError(
            f"mask for group {group!r} has {'NaN' if found != found else found} at {batch}layer {layer}, {unit} {head} "
            f"({int(bad.sum())} such entries); expected {expected}"
        )


def _as_tensor(group: str, value, layers: int, heads: int, unit: str = "head") -> torch.Tensor:
    """A group's mask given as nested lists (or numbers) as a float tensor; a TypeError / ValueError saying what it must be."""
    expected = f"a tensor or nested list of numbers of shape [{layers}, {heads}] (layers x {unit}s; 1 keeps a {unit}, 0 removes it)"
    given = f"got {type(value).__name__} {value!r:.60}"
    if isinstance(value, dict):
        given += " ({layer: [head ids]} is what prune_heads takes)"
    if isinstance(value, (str, bytes, dict)) or value is None:
        raise TypeError(f"mask for group {group!r} must be {expected}, {given}")
    try:
        return torch.as_tensor(value, dtype=torch.float32)
    except ValueError as err:  # rows of different lengths: name the first row whose length is not ``heads``
        rows = value if isinstance(value, (list, tuple)) else []
        wrong = ((layer, row) for layer, row in enumerate(rows) if isinstance(row, (list, tuple)) and len(row) != heads)
        ragged = next((f"layer {layer} has {len(row)} values, expected {heads} (one per {unit})" for layer, row in wrong), err)
        raise ValueError(f"mask for group {group!r} must be {expected}, {given}: {ragged}") from None
    except (TypeError, RuntimeError) as err:
        raise TypeError(f"mask for group {group!r} must be {expected}, {given}: {err}") from None


def normalize_mask(mask, groups: dict[str, tuple[int, int]], hard: bool = False, unit: str = "head") -> dict[str, torch.Tensor]:
    """Check a mask against ``groups`` ({group: (layers, heads)}) and return {group: float tensor}."""
    kind = {"head": "attention", "neuron": "FFN"}.get(unit, unit)  # how the groups of the unit's masks are named in messages
    if mask is None:
        shapes = ", ".join(f"{g} [{layers}, {heads}]" for g, (layers, heads) in groups.items())
        raise TypeError(f"the mask is None: give a dict {{group: tensor [layers, {unit}s]}} with the groups {shapes}")
    if isinstance(mask, torch.Tensor) or not isinstance(mask, dict):
        if len(groups) != 1:
            raise ValueError(
                f"this model has several {kind} groups {sorted(groups)}: give the mask as a dict {{group: tensor [layers, {unit}s]}}"
            )
        mask = {next(iter(groups)): mask}
    out = {}
    for group, value in mask.items():
        if group not in groups:
            raise ValueError(f"unknown {kind} group {group!r} in mask; this model has {sorted(groups)}")
        layers, heads = groups[group]
        value = value if isinstance(value, torch.Tensor) else _as_tensor(group, value, layers, heads, unit)
        if value.dim() not in (2, 3) or tuple(value.shape[-2:]) != (layers, heads):
            raise ValueError(
                f"mask for group {group!r} has shape {tuple(value.shape)}; expected [{layers}, {heads}] "
                f"(layers x {unit}s) or [batch, {layers}, {heads}] (one mask per example)"
            )
        out[group] = value.float() if not value.is_floating_point() else value
        _check_values(group, out[group], hard, unit)
    return out


def hard_mask(mask, groups: dict[str, tuple[int, int]], what: str, unit: str = "head") -> dict[str, torch.Tensor]:
    """A 0/1 mask checked against ``groups``, one [layers, units] per group: ``what`` (what removes units) takes no batch of masks."""
    mask = normalize_mask(mask, groups, hard=True, unit=unit)
    batched = [g for g, m in mask.items() if m.dim() != 2]
    if batched:
        layers, units = groups[batched[0]]
        raise ValueError(f"{what} takes one [{layers}, {units}] mask per group (layers x {unit}s), got a batch of masks for {batched}")
    return mask


def head_list(mask: dict[str, torch.Tensor]) -> dict[str, dict[int, list[int]]]:
    """The heads a 0/1 mask removes: {group: {layer: [head ids]}}."""
    removed = {}
    for group, value in mask.items():
        for layer, head in (value == 0).nonzero().tolist():
            removed.setdefault(group, {}).setdefault(layer, []).append(head)
    return removed


def kv_to_head_mask(kv_mask: dict[str, torch.Tensor], heads_per_kv: dict[str, int]) -> dict[str, torch.Tensor]:
    """A KV-group mask {group: [..., L, KV]} as a query-head mask {group: [..., L, KV * heads_per_kv]}."""
    return {g: m.repeat_interleave(heads_per_kv[g], dim=-1) for g, m in kv_mask.items()}  # repeat_kv's head order
