"""The FFN kind: intermediate neurons of the feed-forward blocks (Kwon et al.'s second unit)."""

from headprune.core.counting import ffn_flops_tables
from headprune.core.families import FFN_GROUPS
from headprune.core.ffn.gates import FFNGates
from headprune.core.ffn.pruning import ffn_record, prune_ffn_mask
from headprune.core.ffn.saving import ffn_meta, rebuild_ffn, verify_ffn
from headprune.core.ffn.sites import FFNSite, ffn_sites_if_any, mlp_layout_of, mlp_layout_refusal
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.projections import out_features


class FFNKind(UnitKind):
    """Intermediate neurons of every feed-forward block, gated at the down projection's input."""

    name, noun, parts, groups, config_fields = "ffn", "neuron", ("feed_forward",), FFN_GROUPS, ("intermediate_size",)
    unit_fields = config_fields
    ablation = (
        "removing one FFN neuron at a time is no useful pruning order: a feed-forward block holds hundreds to thousands of "
        "neurons, each alone moves the output by a small share of its block, below the noise of an evaluation split, "
        "and the order would need one evaluation per neuron; score neurons from gradients instead (prune.order=importance "
        "or fisher: one backward pass for all of them)"
    )
    rearrangement = None
    reconstruction = None  # the down projection is re-solved on the kept neurons' inputs
    rearrange_by = "gradients"
    multiple_setting = "ffn_multiple"
    recovery_parts = ("feed_forward",)
    covered_costs = ("ffn_flops",)
    rebuild_order = 20
    legacy_keys = ("ffn_widths_orig", "pruned_neurons", "ffn_weights_sha256")
    gates_class, site_class = FFNGates, FFNSite
    prune, record, flops_tables = staticmethod(prune_ffn_mask), staticmethod(ffn_record), staticmethod(ffn_flops_tables)
    save_meta, restore, verify = staticmethod(ffn_meta), staticmethod(rebuild_ffn), staticmethod(verify_ffn)
    refusal = staticmethod(mlp_layout_refusal)

    def available(self, model):
        try:
            mlp_layout_of(model)
        except ValueError as err:
            return str(err)
        return None

    def kept_rows(self, model):
        ups = [(site, site.projection(path)) for site in ffn_sites_if_any(model) for path in site.up_paths()]
        # a fused gate/up projection holds two rows per neuron: not one kind's rows
        return {id(up): list(site.neuron_ids) for site, up in ups if out_features(up) == len(site.neuron_ids)}

    def unit_columns(self, site):
        if not isinstance(site, FFNSite) or not site.neuron_ids:
            return None
        return site.down(), list(site.neuron_ids), [[p] for p in range(len(site.neuron_ids))]

    def latency_tables(self, head_tables, ffn_tables, model):
        return ffn_tables
