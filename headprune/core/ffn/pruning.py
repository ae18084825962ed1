"""Physical FFN neuron pruning: remove intermediate channels from the weights, by original neuron id."""

import torch
from torch import nn

from headprune.core.attention.tensors import INPUT_HOOK_ATTR
from headprune.core.ffn.sites import FFNSite, attach_neuron_gate, ffn_sites_if_any, find_ffn_sites
from headprune.core.masks import hard_mask, head_list
from headprune.core.projections import out_features, sliced_projection
from headprune.core.pruning import kept_positions, sites_named
from headprune.core.site_gates import removed_record, unit_groups

WIDTHS_ATTR = "headprune_ffn_widths"  # config field: {group: [neurons each block computes]} once a neuron is pruned


def _row_index(positions: list[int], width: int, blocks: int) -> torch.Tensor:
    """Up-projection rows of the neurons at ``positions`` in each of ``blocks`` row blocks of ``width``; none: the phantom (-1)."""
    index = torch.tensor(positions or [-1], dtype=torch.long)
    return torch.cat([torch.where(index < 0, index, index + block * width) for block in range(blocks)])


def prune_ffn_site(site: FFNSite, neurons: list[int]) -> None:
    """Remove the neurons with these *original* ids from one feed-forward block (already-removed ids are ignored)."""
    keep = kept_positions(site, neurons, "neuron")
    if keep is None:
        return  # nothing new to remove: pruning twice is a no-op
    width, blocks = site.computed_width, site.layout.blocks
    for path in site.up_paths():
        up = site.projection(path)
        if out_features(up) != blocks * width:
            raise ValueError(f"{site.path}.{path} has {out_features(up)} output rows, not {blocks} x {width} neurons")
        site.set_projection(path, sliced_projection(up, _row_index(keep, width, blocks), outputs=True))
    down = site.down()
    gated = getattr(down, INPUT_HOOK_ATTR, None) is not None
    site.set_projection(site.layout.down, sliced_projection(down, _row_index(keep, width, 1), outputs=False))
    if gated:
        attach_neuron_gate(site)  # the new down projection needs the gate hook again
    site.keep(keep)


def ffn_record(model: nn.Module) -> dict[str, dict[str, list[int]]]:
    """{group: {layer (str): [removed original neuron ids]}} for a model ({} when nothing is pruned or it has no FFN blocks)."""
    return removed_record(ffn_sites_if_any(model))


def computed_widths(sites: list[FFNSite]) -> dict[str, list[int]]:
    """{group: [neurons each block computes]} (an emptied block's phantom counts as one)."""
    out = {g: [0] * layers for g, (layers, _) in unit_groups(sites).items()}
    for site in sites:
        out[site.group][site.layer] = site.computed_width
    return out


def sync_ffn_config(model: nn.Module, sites: list[FFNSite]) -> None:
    """Write the blocks' widths into the model config: each width field (one width for all its blocks, else the original one) and ``headprune_ffn_widths``."""
    if all(s.width == s.width_orig for s in sites):
        return  # nothing pruned: the config stays as it was
    for name in dict.fromkeys(site.config_field for site in sites):
        field_sites = [s for s in sites if s.config_field == name]
        widths = {s.computed_width for s in field_sites}
        setattr(model.config, name, widths.pop() if len(widths) == 1 else max(s.width_orig for s in field_sites))
    setattr(model.config, WIDTHS_ATTR, computed_widths(sites))


def prune_neurons(model: nn.Module, neurons: dict) -> dict[str, dict[str, list[int]]]:
    """Remove FFN neurons {group: {layer: [original ids]}} from the weights; returns the cumulative record."""
    all_sites = find_ffn_sites(model)
    for site, ids in sites_named(all_sites, neurons, "FFN group", "FFN group"):
        prune_ffn_site(site, ids)
    sync_ffn_config(model, all_sites)
    return ffn_record(model)


def prune_ffn_mask(model: nn.Module, mask) -> dict[str, dict[str, list[int]]]:
    """Remove every FFN neuron whose mask entry is 0 ({group: [layers, neurons]}, or a bare [layers, neurons] for one group)."""
    mask = hard_mask(mask, unit_groups(find_ffn_sites(model)), "prune_ffn_mask", unit="neuron")
    return prune_neurons(model, head_list({g: m.detach().cpu() for g, m in mask.items()}))
