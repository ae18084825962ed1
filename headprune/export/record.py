"""What an export's record says of its model: whether it was pruned, its widths per layer, whether they split for tensor parallelism."""

from torch import nn

TP_DEGREES = (2, 4, 8)


def removed_units(model: nn.Module) -> dict[str, int]:
    """{record key: units removed} of every kind that removed some from ``model``, each counted by its kind."""
    from headprune.core.unit_kinds import KINDS

    out: dict[str, int] = {}
    for kind in KINDS.values():
        key = kind.record_key or kind.name
        if key not in out:  # kinds sharing a record (head, kv_group) count it once
            out[key] = kind.removed(kind.record(model))
    return {key: n for key, n in out.items() if n}


def is_pruned(model: nn.Module) -> bool:
    """Whether any unit of any kind (heads, neurons, channels, layers ...) was removed from ``model``."""
    return bool(removed_units(model))


def layer_widths(model: nn.Module) -> list[dict]:
    """Per layer of the model's first attention group: query heads, KV heads and FFN neurons kept (0: emptied)."""
    from headprune.core.attention.gates import find_sites
    from headprune.core.ffn.sites import ffn_sites_if_any

    sites = sorted(find_sites(model), key=lambda s: s.layer)
    group = sites[0].group if sites else None
    widths = {site.layer: site.width for site in ffn_sites_if_any(model)}
    return [{"heads": len(s.head_ids), "kv_heads": len(s.kv_ids), "ffn": widths.get(s.layer)} for s in sites if s.group == group]


def splits_over(layer: dict, degree: int) -> bool:
    """Whether vLLM's tensor parallelism of ``degree`` shards this layer (query heads, FFN neurons and KV heads divide, or KV copied)."""
    heads, kv, ffn = layer["heads"], layer["kv_heads"], layer.get("ffn") or 0
    kv_fits = kv == 0 or (kv % degree == 0 if kv >= degree else degree % kv == 0)
    return heads % degree == 0 and kv_fits and ffn % degree == 0


def tensor_parallel(layers: list[dict]) -> dict[str, dict]:
    """{degree: {"suits", "layers": [layers that do not split], "hint"}} for the degrees 2, 4 and 8."""
    out = {}
    for degree in TP_DEGREES:
        bad = [i for i, layer in enumerate(layers) if not splits_over(layer, degree)]
        hint = None
        if bad:
            ffn = [i for i in bad if (layers[i].get("ffn") or 0) % degree]
            hint = (
                f"layers {bad} do not split over {degree} GPUs (query heads, KV heads and FFN neurons must divide by {degree})"
                + (f"; prune with prune.ffn_multiple={degree} (or a multiple) to round FFN widths" if ffn else "")
                + ("; prune.layout=uniform keeps equal head counts" if len(ffn) < len(bad) else "")
            )
        out[str(degree)] = {"suits": not bad, "layers": bad, "hint": hint}
    return out


def console_lines(record: dict) -> list[str]:
    """What the export changed, as printed: zero query heads padded back, degrees of tensor parallelism the widths miss."""
    lines = []
    padded = record.get("padded_query_heads") or []
    if sum(padded):
        lines.append(
            f"[export] {sum(padded)} removed query heads written back as zero heads (per layer {padded}): the file keeps every "
            "query head where a layer keeps attention, and saves what its KV heads cost"
        )
    missed = [d for d, fit in (record.get("tensor_parallel") or {}).items() if not fit["suits"]]
    if missed and record.get("pruned"):
        hint = record["tensor_parallel"][missed[0]]["hint"]
        lines.append(f"[export] widths do not split for tensor parallelism of degree {', '.join(missed)} (vLLM): {hint}")
    return lines
