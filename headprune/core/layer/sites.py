"""Layer sites: a model's Transformer layers, found from the family's attention sites, and the gate on each layer's output."""

import re
from dataclasses import dataclass

from torch import nn

from headprune.core.families import family_for
from headprune.core.site_gates import Site, SiteGates, gate_and_probe, kept_on, ordered_sites

LAYER_GROUPS = ("enc_layer", "dec_layer")  # one group per layer stack: the encoder's (or only) stack, the decoder's
SITE_ATTR = "_headprune_layer_site"  # the site, on its layer module (a deep copy gets its own)
HOOK_ATTR = "_headprune_layer_gate"  # the hook handle, on the layer module
INPUT_NAMES = ("hidden_states", "hidden_state", "x")  # the keyword a layer may take its input hidden states by


@dataclass(eq=False)
class LayerSite(Site):
    """One Transformer layer (``layer``: its original id in its stack, ``path``: its module path now), its one unit."""

    module: nn.Module
    stack: str  # the path of the nn.ModuleList that holds the layer


def layer_stacks(model: nn.Module) -> dict[str, tuple[str, str]]:
    """{layer path now: (stack path, group)} of every layer holding an attention site of the family table, in model order."""
    family = family_for(model)
    found: dict[str, tuple[str, str]] = {}
    for path, _ in model.named_modules():
        for pattern, group in family.sites:
            match = re.search(pattern, path)
            if match:
                found.setdefault(path[: match.end(1)], (path[: match.start(1) - 1], group))
    decoder = {stack for stack, group in found.values() if group == "dec_self"}  # a stack with causal self-attention
    return {layer: (stack, "dec_layer" if stack in decoder else "enc_layer") for layer, (stack, _) in found.items()}


def find_layer_sites(model: nn.Module) -> list[LayerSite]:
    """All Transformer layers of a model, ordered by group then original id (sites already made keep their original ids)."""

    def new_site(path: str, stack: str, group: str) -> LayerSite:
        layers = model.get_submodule(stack)
        if not isinstance(layers, nn.ModuleList):
            raise ValueError(f"{stack} is a {type(layers).__name__}, not an nn.ModuleList: its layers cannot be gated or removed")
        return LayerSite(path, group, int(path.rpartition(".")[2]), 1, [0], model.get_submodule(path), stack, stack_layers=len(layers))

    stacks = layer_stacks(model).items()
    sites = [kept_on(model.get_submodule(path), SITE_ATTR, lambda: new_site(path, stack, group)) for path, (stack, group) in stacks]
    return ordered_sites(sites, LAYER_GROUPS, f"found no Transformer layers in {type(model).__name__}")


def _gate_layer(module, args, kwargs, output):
    """The hook: the layer's output hidden states h moved to x + g * (h - x) (and a fresh probe while recording)."""
    site = getattr(module, SITE_ATTR)
    if site.gate is None and not site.recording:
        return None
    name = next((n for n in INPUT_NAMES if n in kwargs), None)
    if not args and name is None:
        raise ValueError(f"a gated layer was called without its hidden states (keywords {sorted(kwargs)})")
    hidden_in = args[0] if args else kwargs[name]  # the hidden states the layer was called with
    hidden = output[0] if isinstance(output, tuple) else output
    # gate (1,) or (B', 1, 1), probe (B, T, 1): d loss / d probe[b, t] = g * <d loss / d h[b, t], h[b, t] - x[b, t]>
    scale = gate_and_probe(site, hidden, (*hidden.shape[:-1], 1))
    if scale is None:
        return None
    gated = hidden_in + scale * (hidden - hidden_in)
    return (gated, *output[1:]) if isinstance(output, tuple) else gated


def attach_layer_gate(site: LayerSite) -> None:
    """Register the gate hook on the site's layer once."""
    kept_on(site.module, HOOK_ATTR, lambda: site.module.register_forward_hook(_gate_layer, with_kwargs=True))


class LayerGates(SiteGates):
    """A gate on every Transformer layer of a model: masks and scores are {"<stack>_layer": [layers, 1]} by original layer id."""

    unit, noun = "layer", "layer"
    find, attach = staticmethod(find_layer_sites), staticmethod(attach_layer_gate)
