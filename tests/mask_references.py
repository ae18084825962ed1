"""The references the batched mask engines are checked against: one plain forward of the model per mask."""

import torch
import torch.nn.functional as F

from headprune.core.inputs import DECODER_INPUTS


@torch.inference_mode()
def looped_mask_logits(model, gates, batch: dict, masks) -> torch.Tensor:
    """A classifier's logits (M, B, C) under each of M masks."""
    outs = []
    for mk in masks:
        with gates.masked(mk):
            outs.append(model(**batch).logits)
    return torch.stack(outs)


def looped_nll(model, gates, batch: dict, masks) -> torch.Tensor:
    """A causal LM's full logits under each of M masks, as NLL sums (M, B) in float64."""
    outs = []
    with torch.inference_mode():
        for mk in masks:
            with gates.masked(mk):
                logits = model(**{k: batch[k] for k in DECODER_INPUTS}).logits.float()  # (B, T, V)
            nll = F.cross_entropy(logits.transpose(1, 2), batch["labels"], ignore_index=-100, reduction="none")
            outs.append(nll.double().sum(1))
    return torch.stack(outs)


def random_half_mask(gates, seed: int = 0) -> dict:
    """A random hard mask that removes about half the units of every layer, keeping each layer's first."""
    generator = torch.Generator().manual_seed(seed)
    mask = {}
    for group, (layers, units) in gates.groups.items():
        row = (torch.rand(layers, units, generator=generator) > 0.5).float()
        row[:, 0] = 1.0
        mask[group] = row
    return mask


def pruned_half(task) -> tuple:
    """(a physically pruned copy of ``task.model``, the random half mask of its unit that it lost)."""
    import copy

    from headprune.core.units import prune_unit_mask, unit_gates

    model = copy.deepcopy(task.model)
    gates = unit_gates(model, task.gates.unit)
    mask = random_half_mask(gates)
    prune_unit_mask(gates, mask)
    return model, mask
