"""The output-projection gate: a forward pre-hook that scales each head's slice of the output projection's input."""

from headprune.core.attention.tensors import gate_heads

HOOK_ATTR = "_headprune_output_gate"  # the hook handle, on the output projection it is registered on
SITE_ATTR = "_headprune_output_site"  # the site the hook gates, on the same module (a deep copy gets its own copy)


def _scale_heads(module, args):
    """The pre-hook: scale each head's slice of the output projection's input by the gate of the module's site."""
    site = getattr(module, SITE_ATTR)
    if site.gate_at != "output" or (site.gate is None and not site.recording):
        return None
    hidden, *rest = args
    heads = hidden.unflatten(-1, (-1, site.head_dim))  # (B, T, H * D) -> (B, T, H, D)
    return (gate_heads(site, heads).flatten(-2), *rest)


def attach_output_gate(site) -> None:
    """Register the gate hook on the site's output projection once (a no-op unless the site gates at the output)."""
    if site.gate_at != "output":
        return
    output = site.linear("output")
    setattr(output, SITE_ATTR, site)
    if getattr(output, HOOK_ATTR, None) is None:
        setattr(output, HOOK_ATTR, output.register_forward_pre_hook(_scale_heads))
