"""FFN gates: a gate on every intermediate neuron of a model's feed-forward blocks, with the surface of HeadGates."""

from headprune.core.ffn.sites import attach_neuron_gate, find_ffn_sites
from headprune.core.site_gates import SiteGates


class FFNGates(SiteGates):
    """Gates on every FFN neuron of a model: set a mask, read the groups, record gate gradients."""

    unit, noun = "ffn", "neuron"
    find, attach = staticmethod(find_ffn_sites), staticmethod(attach_neuron_gate)
