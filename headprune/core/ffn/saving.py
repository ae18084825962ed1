"""The FFN part of a saved pruned model: per-block widths in config.json, neuron ids and weight digests in the record file."""

from pathlib import Path

from torch import nn

from headprune.core.ffn.pruning import WIDTHS_ATTR, computed_widths, ffn_record, prune_ffn_site, sync_ffn_config
from headprune.core.ffn.sites import FFNSite, ffn_sites_if_any, find_ffn_sites
from headprune.core.record_digests import check_digests, site_digest
from headprune.core.site_gates import unit_groups

DIGESTS = "ffn_weights_sha256"


def ffn_digest(site: FFNSite) -> str:
    """SHA-256 of one feed-forward block's kept neuron ids and its up / down weights (as float32)."""
    up = [site.projection(p) for p in site.up_paths()]
    return site_digest(site, [t for m in up for t in (m.weight, m.bias) if t is not None] + [site.down().weight])


def ffn_meta(model: nn.Module) -> dict | None:
    """The FFN entries of ``headprune_pruning.json`` (None when no neuron is pruned); brings the config's widths up to date first."""
    sites = ffn_sites_if_any(model)
    if all(s.width == s.width_orig for s in sites):
        return None
    sync_ffn_config(model, sites)
    return {
        "ffn_widths_orig": {g: width for g, (_, width) in unit_groups(sites).items()},
        "pruned_neurons": ffn_record(model),
        DIGESTS: {f"{s.group}.{s.layer}": ffn_digest(s) for s in sites},
    }


def rebuild_ffn(model: nn.Module, meta: dict | None, path: Path) -> None:
    """Give a freshly built model the saved FFN widths: slice blocks built at the original width, relabel those built at the kept one."""
    widths = getattr(model.config, WIDTHS_ATTR, None)
    if not widths:
        return
    sites, meta = find_ffn_sites(model), meta or {}
    originals, removed = meta.get("ffn_widths_orig", {}), meta.get("pruned_neurons")
    for site in sites:
        try:
            target = int(widths[site.group][site.layer])
        except (KeyError, IndexError, TypeError):
            raise ValueError(
                f"{WIDTHS_ATTR} in {path / 'config.json'} has no width for {site.group} layer {site.layer}: {widths}"
            ) from None
        built = site.width_orig  # what the config's width field built
        site.width_orig = int(originals.get(site.group, built))
        if removed is None:  # no record: a saved block keeps its first ``target`` neurons
            kept = list(range(target))
        else:
            gone = {int(n) for n in removed.get(site.group, {}).get(str(site.layer), [])}
            kept = [n for n in range(site.width_orig) if n not in gone]
        if built == site.width_orig:
            prune_ffn_site(site, sorted(set(range(built)) - set(kept)))  # built at the original width: slice by original id
        elif built == max(len(kept), 1):
            site.neuron_ids = kept  # built at the kept width (a uniform width field): only the ids to restore
        else:
            raise ValueError(
                f"the FFN record in {path} does not match a {model.config.model_type} model with this config: {site.path} was built {built} wide, but the record keeps {len(kept)} of {site.width_orig} neurons"
            )
    if computed_widths(sites) != {g: [int(w) for w in v] for g, v in widths.items()}:
        raise ValueError(
            f"the FFN record in {path} does not match its config.json: {WIDTHS_ATTR} is {widths}, the record gives {computed_widths(sites)}"
        )
    sync_ffn_config(model, sites)


def verify_ffn(model: nn.Module, meta: dict | None, path: Path) -> None:
    """A ValueError where a feed-forward block's loaded weights are not those saved."""
    check_digests(ffn_sites_if_any(model), (meta or {}).get(DIGESTS), ffn_digest, "feed-forward block", "neuron", path)
