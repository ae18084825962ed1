"""Head-indexed tensors: gates and probes on per-head outputs or projection inputs, and attention kwargs with a head axis."""

import torch

from headprune.core.site_gates import gate_and_probe, kept_on


def gate_heads(site, heads: torch.Tensor) -> torch.Tensor:
    """Per-head outputs (B, T, H, D) times the site's gate, and times a fresh probe (B, T, H) while gate gradients are recorded."""
    scale = gate_and_probe(site, heads[..., 0])  # d loss / d probe[b, t, h] = sum_d g * out * grad: the gate gradient per token
    return heads if scale is None else heads * scale.unsqueeze(-1)


def slice_head_kwargs(site, kwargs: dict) -> dict:
    """Attention kwargs whose head axis 1 spans the original heads (the family's ``head_indexed_kwargs``), cut to the present heads."""
    if not site.family.head_indexed_kwargs or site.num_heads == site.num_heads_orig:
        return kwargs
    out = dict(kwargs)
    for name in site.family.head_indexed_kwargs:
        tensor = kwargs.get(name)
        if isinstance(tensor, torch.Tensor) and tensor.dim() > 1 and tensor.shape[1] == site.num_heads_orig:
            ids = torch.tensor(site.head_ids or [0], device=tensor.device)  # an emptied layer's phantom reads head 0: its values are 0
            out[name] = tensor.index_select(1, ids)  # (B, H_orig, Tq, Tk) -> (B, H, Tq, Tk), by original head id
    return out


def score_bias(site, kwargs: dict) -> torch.Tensor | None:
    """The sum of the (already cut) head-indexed kwargs, additive biases of the attention scores (B, H, Tq, Tk), or None."""
    biases = [kwargs[name] for name in site.family.head_indexed_kwargs if isinstance(kwargs.get(name), torch.Tensor)]
    return sum(biases[1:], biases[0]) if biases else None


INPUT_HOOK_ATTR = "_headprune_input_gate"  # the hook handle, on a projection whose input units a site gates
INPUT_SITE_ATTR = "_headprune_input_site"  # that site, on the same projection (a deep copy gets its own copy)


def _gate_input(module, args):
    """The pre-hook: each unit's slice of the projection's input (``site.unit_width`` columns: a head's, a neuron's) times its gate."""
    site = getattr(module, INPUT_SITE_ATTR)
    if site.gate_at != "output" or (site.gate is None and not site.recording):
        return None
    hidden, *rest = args
    units = hidden.unflatten(-1, (-1, site.unit_width))  # (B, T, U * D) -> (B, T, U, D)
    return (gate_heads(site, units).flatten(-2), *rest)


def gate_input_of(projection, site) -> None:
    """Gate the units of ``projection``'s input by ``site`` (the hook registered once, the site set again after pruning)."""
    setattr(projection, INPUT_SITE_ATTR, site)
    kept_on(projection, INPUT_HOOK_ATTR, lambda: projection.register_forward_pre_hook(_gate_input))


def attach_output_gate(site) -> None:
    """Register the gate hook on the site's output projection once (a no-op unless the site gates at the output)."""
    if site.gate_at == "output":
        gate_input_of(site.linear("output"), site)
