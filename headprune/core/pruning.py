"""Physical head pruning: remove heads from the weights, by original head id."""

import torch
from torch import nn

from headprune.core.attention.gates import AttentionSite, find_sites, route_attention
from headprune.core.attention.tensors import attach_output_gate
from headprune.core.checks import ConfigError
from headprune.core.families import Family
from headprune.core.layer.layer_config import with_layer_fields
from headprune.core.masks import hard_mask, head_list
from headprune.core.projections import sliced_projection
from headprune.core.site_gates import removed_record, unit_groups

RECORD_ATTR = "headprune_pruned_heads"  # the config field that replaces v4's config.pruned_heads


def integer_id(value, what: str) -> int:
    """``value`` as an int (ints, numpy/torch integers, integral floats such as 2.0, digit strings), else a ValueError."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    if not isinstance(value, bool):
        try:
            as_float = float(value)
            if as_float == int(as_float):
                return int(as_float)
        except (TypeError, ValueError, OverflowError):
            pass
    raise ValueError(f"{what} must be an integer, got {value!r} ({type(value).__name__})")


def kept_positions(site, ids: list, noun: str) -> list[int] | None:
    """Weight positions of a site's units kept when the units of these *original* ids go; None when none of them is still in the weights."""
    ids = [integer_id(i, f"{noun} id for {site.group} layer {site.layer}") for i in ids]
    bad = [i for i in ids if not 0 <= i < site.units_orig]
    if bad:
        raise IndexError(f"{noun} ids {bad[:10]} out of range for {site.group} layer {site.layer} ({site.units_orig} {noun}s)")
    remove = set(ids)
    keep = [pos for pos, unit in enumerate(site.unit_ids) if unit not in remove]
    return None if len(keep) == len(site.unit_ids) else keep


def sites_named(sites: list, ids: dict, kind: str, short: str) -> list[tuple]:
    """[(site, [ids])] for a {group: {layer: [original ids]}} record over ``sites``; unknown groups and layers are errors."""
    by_key = {(s.group, s.layer): s for s in sites}
    groups = sorted({g for g, _ in by_key})
    out = []
    for group, layers in ids.items():
        if group not in groups:
            raise ValueError(f"unknown {kind} {group!r}; this model has {groups}")
        for layer, chosen in layers.items():
            layer = integer_id(layer, f"layer id for group {group!r}")
            site = by_key.get((group, layer))
            if site is None:
                n_layers = 1 + max(l for g, l in by_key if g == group)
                raise IndexError(f"layer {layer} out of range for {short} {group!r} ({n_layers} layers)")
            out.append((site, list(chosen)))
    return out


def _units(head_positions: list[int], head_dim: int) -> torch.Tensor:
    """Weight units (rows or columns) of the heads at these positions; none left: one zero phantom head (-1s)."""
    if not head_positions:
        return torch.full((head_dim,), -1, dtype=torch.long)
    return torch.cat([torch.arange(p * head_dim, (p + 1) * head_dim) for p in head_positions])


def _fused_units(site: AttentionSite, keep: list[int], kv_keep: list[int]) -> torch.Tensor:
    """Output units of a fused q/k/v projection keeping these query and KV head positions, in its layout."""
    layout, d = site.family.fused_layout, site.head_dim
    old = layout(site.computed_heads, site.computed_kv_heads, d)  # (H, D), (KV, D), (KV, D) in the present weights
    new = layout(max(len(keep), 1), max(len(kv_keep), 1), d)
    index = torch.full((sum(part.numel() for part in new),), -1, dtype=torch.long)  # -1: the phantom head's zeros
    for old_part, new_part, positions in zip(old, new, (keep, kv_keep, kv_keep)):
        if positions:
            index[new_part.flatten()] = old_part[positions].flatten()
    return index


def _slice(site: AttentionSite, which: str, units: torch.Tensor, outputs: bool = True) -> None:
    """Replace the module's projection ``which`` by a copy keeping its output (``outputs``) or input ``units``."""
    site.block.set_submodule(getattr(site.family, which), sliced_projection(site.linear(which), units, outputs))


def inexact_reason(family: Family, config, parts: tuple[str, ...] | None = None) -> str | None:
    """Why removing heads from this family's attention cannot give the masked model's outputs (None: it can); ``config`` is a
    model config or its fields; ``parts``: the parts the pruning removes units of (None: any), norms across heads refuse
    only those that touch the heads."""
    for flag, why in family.unprunable_if:
        if config.get(flag, False) if isinstance(config, dict) else getattr(config, flag, False):
            return f"a {family.name} model with {flag}=True cannot be pruned physically: {why}"
    norms = family.cross_head_norms
    if norms and (parts is None or "attention" in parts):  # neurons, layers, residual channels and tokens keep each head whole
        return (
            f"{family.name} attention normalises all heads together ({', '.join(norms)} are RMSNorms over heads x "
            f"head_dim), so removing a head changes how the remaining heads are normalised: a physically pruned "
            f"{family.name} model cannot equal the masked one, and headprune does not prune it"
        )
    return None


def prune_site(site: AttentionSite, heads: list[int]) -> None:
    """Remove the heads with these *original* ids from one attention module (already-removed ids are ignored)."""
    keep = kept_positions(site, heads, "head")
    if keep is None:
        return  # nothing new to remove: pruning twice is a no-op
    reason = inexact_reason(site.family, getattr(site.core, "config", None))  # some attention modules keep no config
    if reason:
        raise ConfigError(
            f"{reason} ({site.path}). Gates, importance scores and ablation work on it: use masks (HeadGates.masked) instead of pruning."
        )
    needed_kv = {site.kv_of(site.head_ids[pos]) for pos in keep}
    kv_keep = [pos for pos, kv in enumerate(site.kv_ids) if kv in needed_kv]  # a KV head goes with its last query head
    per_kv = [sum(site.kv_of(site.head_ids[p]) == kv for p in keep) for kv in site.kv_ids]
    if not site.family.kv_groups_attr and len({n for n in per_kv if n}) > 1:  # no KV expansion to map query heads one by one
        raise ConfigError(
            f"{site.family.name} attention needs as many query heads for every KV head, and this mask leaves "
            f"{per_kv} query heads over the KV heads {site.kv_ids} of {site.path}: prune whole KV groups "
            "(prune.unit=kv_group, headprune.prune_kv_groups) or as many heads of every group"
        )
    head_units = _units(keep, site.head_dim)
    if site.family.fused_layout is not None:
        _slice(site, "query", _fused_units(site, keep, kv_keep))
    else:
        _slice(site, "query", head_units)
        for which in ("key", "value"):
            _slice(site, which, _units(kv_keep, site.head_dim))
    _slice(site, "output", head_units, outputs=False)
    attach_output_gate(site)  # the new output projection needs the gate hook again
    modules = dict(site.block.named_modules())
    for path in site.family.head_rows:  # the family's other per-head projections that this module has, sliced like the query
        if isinstance(modules.get(path), nn.Linear):
            site.block.set_submodule(path, sliced_projection(modules[path], head_units, outputs=True))
    site.keep(keep)
    site.kv_ids = [site.kv_ids[pos] for pos in kv_keep]
    # tell the attention module its new head and KV head counts (the phantom head counts as one)
    family, count, kv_count = site.family, site.computed_heads, site.computed_kv_heads
    if family.head_count_attr:
        setattr(site.core, family.head_count_attr, count)
    for attr in family.width_attrs:
        setattr(site.core, attr, count * site.head_dim)
    for attr in family.kv_count_attrs:
        setattr(site.core, attr, kv_count)
    if family.config_head_attrs:
        site.core.config = with_layer_fields(site.core.config, **dict.fromkeys(family.config_head_attrs, count))
    if family.kv_groups_attr:  # the model's own KV expansion where query heads still form equal groups, else each its own
        positions = site.kv_positions()  # (H,) KV position of each computed query head
        groups = len(positions) // kv_count
        even = len(positions) == groups * kv_count and positions == [p // groups for p in range(len(positions))]
        setattr(site.core, family.kv_groups_attr, groups if even else 1)
        site.kv_index = None if even else torch.tensor(positions, dtype=torch.long)


def pruning_record(model: nn.Module) -> dict[str, dict[str, list[int]]]:
    """{group: {layer (str): [removed original head ids]}} for a model."""
    return removed_record(find_sites(model))


def prune_heads(model: nn.Module, heads: dict) -> dict[str, dict[str, list[int]]]:
    """Remove heads {group: {layer: [original ids]}} from the weights; returns the cumulative record."""
    sites = find_sites(model)
    for site, ids in sites_named(sites, heads, "attention group", "group"):
        prune_site(site, ids)
    if any(site.needs_wrapper for site in sites):
        route_attention(model)  # uneven KV groups and head-indexed kwargs to cut run through headprune's attention wrapper
    record = pruning_record(model)
    setattr(model.config, RECORD_ATTR, record)
    return record


def prune_mask(model: nn.Module, mask) -> dict[str, dict[str, list[int]]]:
    """Remove every head whose mask entry is 0 ({group: [layers, heads]}, or a bare [layers, heads] for one group)."""
    mask = hard_mask(mask, unit_groups(find_sites(model)), "prune_mask")
    return prune_heads(model, head_list({g: m.detach().cpu() for g, m in mask.items()}))


def prune_kv_groups(model: nn.Module, kv_heads: dict) -> dict[str, dict[str, list[int]]]:
    """Remove KV heads {group: {layer: [original KV ids]}} together with all of their query heads."""
    heads: dict[str, dict] = {}
    for site, ids in sites_named(find_sites(model), kv_heads, "attention group", "group"):
        bad = [k for k in ids if not 0 <= int(k) < site.num_kv_heads_orig]
        if bad:
            raise IndexError(f"KV head ids {bad} out of range for {site.group} layer {site.layer} ({site.num_kv_heads_orig} KV heads)")
        n = site.heads_per_kv
        heads.setdefault(site.group, {})[site.layer] = [h for k in ids for h in range(int(k) * n, (int(k) + 1) * n)]
    return prune_heads(model, heads)
