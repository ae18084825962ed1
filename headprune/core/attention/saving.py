"""The attention part of a saved pruned model: the head record in config.json (and v4's field), head counts and weight digests."""

from pathlib import Path

from torch import nn

from headprune.core.attention.gates import AttentionSite, find_sites
from headprune.core.families import family_for
from headprune.core.pruning import RECORD_ATTR, prune_heads, pruning_record
from headprune.core.record_digests import check_digests, site_digest

V4_ATTR = "pruned_heads"  # transformers v4's config field: {layer: [head ids]} of one attention group
V4_GROUP = {"bert-like": "enc_self", "distilbert": "enc_self", "vit-like": "enc_self"}  # families v4 pruned, and the group it meant
# (v4's T5 prune_heads failed with an AttributeError, so no T5 directory was ever pruned by v4 nor loads pruned in it)
DIGESTS = "weights_sha256"


def weights_digest(site: AttentionSite) -> str:
    """SHA-256 of one attention module's kept head ids and its q/k/v/output weights (as float32)."""
    linears = {which: site.linear(which) for which in ("query", "key", "value", "output")}
    tensors = [t for which, m in linears.items() for t in (m.weight, m.bias if which != "output" else None) if t is not None]
    return site_digest(site, tensors)


def head_meta(model: nn.Module) -> dict:
    """The attention entries of ``headprune_pruning.json``; writes the record (and v4's field where it fits) into the config first."""
    record = pruning_record(model)
    setattr(model.config, RECORD_ATTR, record)
    group = V4_GROUP.get(family_for(model).name)
    if group is not None and not set(record) - {group}:  # v4's layout {layer: [ids]} of one group can express it
        setattr(model.config, V4_ATTR, {layer: list(ids) for layer, ids in record.get(group, {}).items()})  # v4 prunes on load
    sites = find_sites(model)
    return {
        "pruned_heads": record,
        "heads_present": {f"{s.group}.{s.layer}": len(s.head_ids) for s in sites},
        DIGESTS: {f"{s.group}.{s.layer}": weights_digest(s) for s in sites},
    }


def rebuild_heads(model: nn.Module, meta: dict | None, path: Path) -> None:
    """Remove the recorded heads from a freshly built model (config.json's record, else v4's); ``meta`` must agree with it."""
    config = model.config
    record = getattr(config, RECORD_ATTR, None) or {}
    if meta is not None and meta.get("pruned_heads", {}) != record:
        raise ValueError(
            f"{path / 'headprune_pruning.json'} and config.json disagree on the pruned heads: {meta.get('pruned_heads', {})} vs {record}"
        )
    v4_record = getattr(config, V4_ATTR, None)
    if v4_record and not record:  # a directory pruned by transformers v4 (save_pruned writes both: ours wins)
        family = family_for(model).name
        if family not in V4_GROUP:
            raise ValueError(f"config.json has v4 pruned_heads, but v4 pruned no heads in the {family} family")
        layers = {str(int(layer)): sorted(int(h) for h in ids) for layer, ids in v4_record.items() if ids}
        record = {V4_GROUP[family]: layers} if layers else {}
    try:
        prune_heads(model, record)
    except (IndexError, ValueError) as err:
        raise ValueError(f"the pruning record in {path} does not match a {config.model_type} model with this config: {err}") from err


def verify_heads(model: nn.Module, meta: dict | None, path: Path) -> None:
    """A ValueError where an attention module's loaded weights are not those saved."""
    check_digests(find_sites(model), (meta or {}).get(DIGESTS), weights_digest, "attention module", "head", path)
