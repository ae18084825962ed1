"""FFN gates: a gate on every intermediate neuron of a model's feed-forward blocks, with the surface of HeadGates.

Masks and scores are {group: [layers, neurons]} (``enc_ffn``, ``dec_ffn``) by original neuron id, or
[batch, layers, neurons] for one mask per example; groups left out are not gated.
"""

from __future__ import annotations

import torch
from torch import nn

from headprune.core.ffn_sites import FFNSite, attach_neuron_gate, ffn_groups, find_ffn_sites
from headprune.core.masks import normalize_mask
from headprune.core.site_gates import SiteGateMethods


class FFNGates(SiteGateMethods):
    """Gates on every FFN neuron of a model: set a mask, read the groups, record gate gradients."""

    unit = "ffn"

    def __init__(self, model: nn.Module):
        self.model = model
        self.sites = find_ffn_sites(model)
        for site in self.sites:
            attach_neuron_gate(site)

    # ---- structure -------------------------------------------------------------------------
    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """{group: (layers, neurons per layer in the original model)}."""
        return ffn_groups(self.sites)

    @property
    def num_neurons(self) -> int:
        """Neurons in the original model, all groups."""
        return sum(layers * width for layers, width in self.groups.values())

    def site(self, group: str, layer: int) -> FFNSite:
        """The feed-forward block of one group and layer."""
        for site in self.sites:
            if site.group == group and site.layer == layer:
                return site
        raise IndexError(f"no feed-forward block for group {group!r} layer {layer}: groups are {self.groups}")

    def present(self) -> dict[str, torch.Tensor]:
        """{group: bool [layers, neurons]}: True where a neuron is still in the weights (not pruned)."""
        out = {g: torch.zeros(l, w, dtype=torch.bool) for g, (l, w) in self.groups.items()}
        for site in self.sites:
            out[site.group][site.layer, site.neuron_ids] = True
        return out

    def widths(self) -> dict[str, list[int]]:
        """{group: [neurons present per layer]}."""
        out = {g: [0] * layers for g, (layers, _) in self.groups.items()}
        for site in self.sites:
            out[site.group][site.layer] = site.width
        return out

    def ones(self) -> dict[str, torch.Tensor]:
        """A mask that keeps every neuron: {group: ones [layers, neurons]}."""
        return {g: torch.ones(l, w) for g, (l, w) in self.groups.items()}

    # ---- masks -----------------------------------------------------------------------------
    def normalize_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """Check a mask against the model: {group: [L, W] or [B, L, W]} (``hard``: 0/1 only)."""
        return normalize_mask(mask, self.groups, hard=hard, unit="neuron")

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{"ffn": the checked neuron mask}: what the mask gates, by the kind of gates that act."""
        return {"ffn": self.normalize_mask(mask, hard=hard)}

    def head_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """No head is gated by a neuron mask: {} (checked first)."""
        self.normalize_mask(mask, hard=hard)
        return {}

    def set_mask(self, mask) -> None:
        """Gate every neuron by ``mask`` ({group: [L, W] or [B, L, W]}); ``None`` removes all gates."""
        mask = {} if mask is None else self.normalize_mask(mask)
        for site in self.sites:
            value = mask.get(site.group)
            if value is None:
                site.gate = None
                continue
            ids = torch.tensor(site.neuron_ids or [0], dtype=torch.long, device=value.device)
            gate = value[..., site.layer, :].index_select(-1, ids)
            site.gate = gate if site.neuron_ids else gate * 0  # an emptied block's phantom neuron stays zero

    # ---- gate gradients: probing() comes from SiteGateMethods --------------------------------
    def remove(self) -> None:
        """Clear every gate (the hooks stay, and do nothing without a gate)."""
        self.set_mask(None)

    def describe(self) -> str:
        """A one-line-per-group summary of the feed-forward blocks."""
        return "\n".join(
            f"{group:9s} layers={layers} neurons/layer={width} present={self.widths()[group]}"
            for group, (layers, width) in self.groups.items()
        )
