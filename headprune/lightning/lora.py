"""LoRA adapters (peft) on the attention and MLP projections of a model, merged back into plain weights."""

import torch
from torch import nn

from headprune.core.attention.gates import find_sites


def lora_targets(model: nn.Module) -> list[str]:
    """Names of every ``nn.Linear`` inside a layer that holds an attention module (attention and MLP projections)."""
    layers = {site.path.rpartition(".")[0] for site in find_sites(model)}  # e.g. model.layers.3 for model.layers.3.self_attn
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and any(name.startswith(layer + ".") for layer in layers)
    ]


def smallest_projection(model: nn.Module) -> int:
    """The smallest width of the projections LoRA adapts (emptied ones left out): the largest rank that is still low rank."""
    modules = dict(model.named_modules())
    widths = [min(modules[name].in_features, modules[name].out_features) for name in lora_targets(model)]
    return min([w for w in widths if w > 0] or widths)


def add_lora(model: nn.Module, rank: int, alpha: float | None = None, seed: int = 0):
    """Inject LoRA adapters of ``rank`` (scale alpha / rank; alpha defaults to 2 x rank) in place; returns the peft model."""
    from peft import LoraConfig, get_peft_model

    targets = lora_targets(model)
    if not targets:
        raise ValueError(f"{type(model).__name__} has no linear projections in its attention layers to adapt")
    config = LoraConfig(
        r=rank, lora_alpha=float(alpha if alpha is not None else 2 * rank), lora_dropout=0.0, target_modules=targets, bias="none"
    )
    model._headprune_requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # the adapters' A matrices start from a seeded draw
        return get_peft_model(model, config)


def merge_lora(peft_model) -> nn.Module:
    """Fold the adapters into their projections and return the plain model (the one given to ``add_lora``)."""
    model = peft_model.merge_and_unload()
    flags = model.__dict__.pop("_headprune_requires_grad", {})
    for name, parameter in model.named_parameters():
        parameter.requires_grad_(flags.get(name, True))
    return model
