"""Physical layer removal: delete whole Transformer layers from their stacks, by original layer id."""

from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.ffn.sites import ffn_sites_if_any
from headprune.core.layer.sites import LayerSite, find_layer_sites
from headprune.core.pruning import integer_id

REMOVED_ATTR = "headprune_removed_layers"  # config field: {group: [removed original layer ids]}
FIRST_LAYER_STATE = {"relative_attention_bias": "has_relative_attention_bias"}  # T5: a stack's first layer makes its position bias


def shared_weights(model: nn.Module) -> str | None:
    """Why this model's layers cannot be removed one by one because they share weights (None: they share none)."""
    owner: dict[int, str] = {}
    for site in find_layer_sites(model):
        for name, param in site.module.named_parameters():
            other = owner.setdefault(id(param), f"{site.group} layer {site.layer}")
            if other != f"{site.group} layer {site.layer}":
                return f"{other} and {site.group} layer {site.layer} share the weight {name}: removing one layer would change the other"
    return None


def _first_only(sites: list[LayerSite]) -> list[str]:
    """Submodule paths the stack's first layer holds and its second does not (state the first layer makes for the others)."""
    if len(sites) < 2:
        return []
    later = {name for name, _ in sites[1].module.named_modules()}
    return [name for name, _ in sites[0].module.named_modules() if name not in later and name.rpartition(".")[0] in later]


def _refusal(model: nn.Module, stack: list[LayerSite], removed: set[int]) -> str | None:
    """Why these layers of one stack cannot be removed exactly (None: they can)."""
    kept = [s for s in stack if s.layer not in removed]
    if not kept:
        return f"removing every layer of {stack[0].group} leaves an empty stack: keep at least one layer per stack"
    first_only = _first_only(stack)
    unknown = [p for p in first_only if p.rpartition(".")[2] not in FIRST_LAYER_STATE]
    if stack[0].layer in removed and unknown:
        return f"the first layer of {stack[0].group} holds {unknown}, which the other layers do not have: it cannot be removed"
    renumbered = any(new != s.layer for new, s in enumerate(kept))
    if renumbered and getattr(model.config, "scale_attn_by_inverse_layer_idx", False):
        return "scale_attn_by_inverse_layer_idx scales each attention by its layer index: a renumbered layer would scale differently"
    return None


def pin_layer_ids(model: nn.Module) -> None:
    """Give every attention and FFN site the original id of the layer holding it and its stack's original layer count."""
    owner = {id(m): site for site in find_layer_sites(model) for m in site.module.modules()}
    for site in [*find_sites(model), *ffn_sites_if_any(model)]:
        layer = owner.get(id(site.block if hasattr(site, "block") else site.module))
        if layer is not None:
            parts = site.path.split(".")  # [*stack, layer index, *path inside the layer]: the index as it is now
            parts[len(layer.stack.split("."))] = layer.path.rpartition(".")[2]
            site.path = ".".join(parts)
            site.layer, site.stack_layers = layer.layer, layer.stack_layers


def _renumber(model: nn.Module, stack: list[LayerSite], kept: list[LayerSite]) -> None:
    """Delete the removed layers from their nn.ModuleList and renumber the kept ones' ``layer_idx`` and paths."""
    layers = model.get_submodule(stack[0].stack)
    keep_ids = {id(s.module) for s in kept}
    for position in reversed(range(len(layers))):
        if id(layers[position]) not in keep_ids:
            del layers[position]
    for position, site in enumerate(kept):
        for module in site.module.modules():
            if isinstance(getattr(module, "layer_idx", None), int):
                module.layer_idx = position
        site.path = f"{site.stack}.{position}"


def _sync_config(model: nn.Module, group: str, kept_positions: list[int]) -> None:
    """Set the stack's count field and slice config.layer_types where it lists the layers num_hidden_layers counts."""
    config = model.config
    decoder = group == "dec_layer" and getattr(config, "is_encoder_decoder", False)  # the decoder's own count field:
    field = next(f for f in ("num_decoder_layers", "decoder_layers") if hasattr(config, f)) if decoder else "num_hidden_layers"
    types = getattr(config, "layer_types", None)  # a config list with one entry per layer of the (first) stack
    if field == "num_hidden_layers" and isinstance(types, (list, tuple)) and len(types) == config.num_hidden_layers:
        config.layer_types = [types[p] for p in kept_positions]
    setattr(config, field, len(kept_positions))
    if getattr(config, "is_encoder_decoder", False) and hasattr(config, "num_decoder_layers"):
        # generate sizes its self-attention cache from get_text_config(decoder=True), which reads a T5-style config's
        # decoder count only under `decoder_layers`: without the copy, a shallower encoder leaves decoder layers uncached
        config.decoder_layers = config.num_decoder_layers


def removed_layers(model: nn.Module) -> dict[str, list[int]]:
    """{group: [removed original layer ids]} of a model ({} when no layer is removed)."""
    gone: dict[str, set[int]] = {}
    for site in find_layer_sites(model):  # each stack's original ids, less those of the layers still in it
        gone.setdefault(site.group, set(range(site.stack_layers))).discard(site.layer)
    return {group: sorted(ids) for group, ids in gone.items() if ids}


def remove_layers(model: nn.Module, layers: dict) -> dict[str, list[int]]:
    """Remove layers {group: [original ids]} from the model (already-removed ids are ignored); returns ``removed_layers``."""
    if getattr(model.config, "is_heterogeneous", False):
        raise ValueError("this model's config has per_layer_config (heterogeneous layers): headprune does not remove its layers")
    reason = shared_weights(model)
    if reason:
        raise ValueError(f"cannot remove layers: {reason}")
    pin_layer_ids(model)
    sites = find_layer_sites(model)
    groups = sorted({s.group for s in sites})
    for group, ids in layers.items():
        if group not in groups:
            raise ValueError(f"unknown layer group {group!r}; this model has {groups}")
        stack = [s for s in sites if s.group == group]
        ids = {integer_id(i, f"layer id for group {group!r}") for i in ids}
        bad = sorted(i for i in ids if not 0 <= i < stack[0].stack_layers)
        if bad:
            raise IndexError(f"layer ids {bad} out of range for {group!r} ({stack[0].stack_layers} layers)")
        if not ids & {s.layer for s in stack}:
            continue
        reason = _refusal(model, stack, ids)
        if reason:
            raise ValueError(f"cannot remove layers {sorted(ids)} of {group}: {reason}")
        kept = [s for s in stack if s.layer not in ids]
        for path in _first_only(stack) if stack[0] is not kept[0] else ():  # a removed first layer's state (T5's position bias)
            parent_path, _, name = path.rpartition(".")  # handed to the new first layer
            if name in FIRST_LAYER_STATE:
                kept[0].module.set_submodule(path, stack[0].module.get_submodule(path))
                setattr(kept[0].module.get_submodule(parent_path), FIRST_LAYER_STATE[name], True)
        _sync_config(model, group, [stack.index(s) for s in kept])
        _renumber(model, stack, kept)
    pin_layer_ids(model)
    record = removed_layers(model)
    setattr(model.config, REMOVED_ATTR, record)
    return record


def restore_layer_ids(model: nn.Module, removed: dict | None) -> None:
    """Give a model built from a layer-pruned config its original layer ids (before its heads and FFN widths are rebuilt)."""
    if not removed:
        return
    sites = find_layer_sites(model)
    for group, ids in removed.items():
        stack = [s for s in sites if s.group == group]
        if not stack:
            raise ValueError(f"{REMOVED_ATTR} names the layer group {group!r}, which this model does not have")
        gone = sorted(int(i) for i in ids)
        originals = [i for i in range(len(stack) + len(gone)) if i not in gone]
        if len(originals) != len(stack):
            raise ValueError(f"{REMOVED_ATTR} removes {gone} from {group}, which does not match its {len(stack)} layers")
        for site, original in zip(stack, originals):
            site.layer, site.stack_layers = original, len(stack) + len(gone)
    pin_layer_ids(model)
