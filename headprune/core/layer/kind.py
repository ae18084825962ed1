"""The layer kind: whole Transformer layers (depth pruning: Minitron's depth axis)."""

import torch

from headprune.core.attention.gates import find_sites
from headprune.core.counting import site_flops, site_tables
from headprune.core.ffn.sites import ffn_sites_if_any
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.layer.removal import REMOVED_ATTR, remove_layers, removed_layers, restore_layer_ids, shared_weights
from headprune.core.layer.sites import LAYER_GROUPS, LayerGates, LayerSite, find_layer_sites, layer_stacks
from headprune.core.masks import hard_mask
from headprune.core.projections import in_features, is_projection, out_features


class LayerKind(UnitKind):
    """Whole Transformer layers: one gate per layer on its hidden-state output."""

    name, noun, parts, groups = "layer", "layer", ("depth",), LAYER_GROUPS
    config_fields = ("num_hidden_layers", "decoder_layers", "num_decoder_layers")  # the decoder's own in encoder-decoder configs
    reconstruction = None  # a removed layer's residual update is folded into the residual writer of the kept layer below it
    rearrangement = (
        "a layer unit is one whole layer, and rearrangement keeps each layer's count of units while it re-chooses which "
        "go: with one unit per layer there is nothing to re-choose"
    )
    keep_one = (
        "keep-one keeps each layer's best unit and removes the rest of that layer, and a layer is its one unit: it would "
        "remove nothing and report the unpruned score for every layer"
    )
    layout_refusal = {
        "uniform": "prune.unit=layer with prune.layout=uniform would remove the same share of units from every layer, one "
        "unit per layer: it would remove every layer at once; use prune.layout=global"
    }
    floor_units = None  # one unit per layer: a per-layer floor of units would forbid removing any layer
    group_floor = 1  # a stack keeps a layer: no family runs an empty stack
    record_key = "layers"  # {group: {layer (str): [0]}}: each removed layer as its one unit
    rebuild_order = 0  # depth first: the widths of the other kinds are recorded by original layer id
    legacy_keys = ("removed_layers",)
    gates_class, site_class = LayerGates, LayerSite
    units_per_layer = staticmethod(lambda fields: 1)

    def available(self, model):
        try:
            return shared_weights(model)
        except ValueError as err:
            return str(err)

    def flops_tables(self, model, seq_len):
        def flops(site) -> int:  # its attention modules' and every other projection's, for one example of ``seq_len`` tokens
            attention, _ = parts_of(model, site)
            counted = {id(p) for s in attention for p in s.projections()}
            others = [m for m in site.module.modules() if is_projection(m) and id(m) not in counted]
            return sum(site_flops(s, seq_len) for s in attention) + sum(2 * in_features(m) * out_features(m) * seq_len for m in others)

        return _tables(model, flops)

    def surgeon_blocks(self, model, gates):
        def writers(site) -> list:  # a removed layer's error: everything its attention and FFN write into the stream
            attention, ffn = parts_of(model, site)
            return [s.linear("output") for s in attention if s.head_ids] + [f.down() for f in ffn if f.neuron_ids]

        return [(s.group, s.layer, writers(s), [0], None) for s in gates.sites if isinstance(s, LayerSite)]

    def nested_rows(self, model):
        return {
            (site.group, site.layer): [(s.group, s.layer) for part in parts_of(model, site) for s in part]
            for site in find_layer_sites(model)
        }

    def latency_parts(self):
        return ("attention", "feed_forward")  # a layer's seconds are its attention's and its FFN's, timed

    def latency_tables(self, head_tables, ffn_tables, model):
        def seconds(site) -> float:
            attention, ffn = parts_of(model, site)
            kept = sum(float(head_tables[s.group][s.layer, len(s.head_ids)]) for s in attention)  # its heads present, timed
            return kept + (sum(float(ffn_tables[f.group][f.layer, f.width]) for f in ffn) if ffn_tables else 0.0)

        return _tables(model, seconds)

    def prune(self, model, mask):
        mask = hard_mask(mask, LayerGates(model).groups, "removing layers", unit="layer")
        remove_layers(model, {g: (m[:, 0] == 0).nonzero().flatten().tolist() for g, m in mask.items()})
        return self.record(model)

    def record(self, model):
        if not layer_stacks(model):
            return {}  # no layers headprune can find, so none it removed
        return {group: {str(layer): [0] for layer in ids} for group, ids in removed_layers(model).items() if ids}  # each layer its one unit

    def save_meta(self, model):
        layers = getattr(model.config, REMOVED_ATTR, None) or {}  # {group: [original ids]}: config.json holds them too
        return {"removed_layers": layers} if layers else None

    def restore(self, model, meta, path):
        layers = getattr(model.config, REMOVED_ATTR, None) or {}
        if meta is not None and meta.get("removed_layers", {}) != layers:
            raise ValueError(
                f"{path / 'headprune_pruning.json'} and config.json disagree on the removed layers: {meta.get('removed_layers', {})} vs {layers}"
            )
        restore_layer_ids(model, layers)


def _tables(model, cost) -> dict[str, torch.Tensor]:
    """{group: [layers, 2]}: a layer removed costs 0, kept ``cost(site)``; a layer already removed 0 either way."""
    return site_tables(find_layer_sites(model), lambda site: torch.tensor([0.0, float(cost(site))], dtype=torch.float64))


def parts_of(model, site) -> tuple[list, list]:
    """(attention sites, FFN sites) inside one layer."""
    inside = {id(m) for m in site.module.modules()}
    return [s for s in find_sites(model) if id(s.block) in inside], [s for s in ffn_sites_if_any(model) if id(s.module) in inside]
