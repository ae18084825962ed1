"""FFN gates: a gate on every intermediate neuron of a model's feed-forward blocks, with the surface of HeadGates."""

from torch import nn

from headprune.core.ffn.sites import attach_neuron_gate, find_ffn_sites
from headprune.core.site_gates import SiteGates


class FFNGates(SiteGates):
    """Gates on every FFN neuron of a model: set a mask, read the groups, record gate gradients."""

    unit = "ffn"
    noun = "neuron"

    def __init__(self, model: nn.Module):
        self.model = model
        self.sites = find_ffn_sites(model)
        for site in self.sites:
            attach_neuron_gate(site)

    def widths(self) -> dict[str, list[int]]:
        """{group: [neurons present per layer]}."""
        out = {g: [0] * layers for g, (layers, _) in self.groups.items()}
        for site in self.sites:
            out[site.group][site.layer] = site.width
        return out

    def describe(self) -> str:
        """A one-line-per-group summary of the feed-forward blocks."""
        return "\n".join(
            f"{group:9s} layers={layers} neurons/layer={width} present={self.widths()[group]}"
            for group, (layers, width) in self.groups.items()
        )
