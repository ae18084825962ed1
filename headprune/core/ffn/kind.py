"""The FFN kind: intermediate neurons of the feed-forward blocks (Kwon et al.'s second unit)."""

from headprune.core.ffn.gates import FFNGates
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.mlp_layouts import FFN_GROUPS
from headprune.core.projections import out_features

NEURON_ABLATION = (
    "removing one FFN neuron at a time is no useful pruning order: a feed-forward block holds hundreds to thousands of "
    "neurons, each alone moves the output by a small share of its block, below the noise of an evaluation split, "
    "and the order would need one evaluation per neuron; score neurons from gradients instead (prune.order=importance "
    "or fisher: one backward pass for all of them)"
)


class FFNKind(UnitKind):
    """Intermediate neurons of every feed-forward block, gated at the down projection's input."""

    name = "ffn"
    parts = ("feed_forward",)
    noun = "neuron"
    config_fields = ("intermediate_size",)
    ablation = NEURON_ABLATION
    rearrangement = None
    reconstruction = None  # the down projection is re-solved on the kept neurons' inputs
    rearrange_by = "gradients"
    multiple_setting = "ffn_multiple"
    recovery_parts = ("feed_forward",)
    record_key = "ffn"
    rebuild_order = 20
    legacy_keys = ("ffn_widths_orig", "pruned_neurons", "ffn_weights_sha256")
    gates_class = FFNGates

    def owns(self, group: str) -> bool:
        return group in FFN_GROUPS

    def group_names(self, attention_groups):
        return [ffn for attention, ffn in zip(("enc_self", "dec_self"), FFN_GROUPS) if attention in attention_groups]

    def available(self, model):
        from headprune.core.ffn.sites import mlp_layout_of

        try:
            mlp_layout_of(model)
        except ValueError as err:
            return str(err)
        return None

    def refusal(self, fields, settings):
        from headprune.core.ffn.sites import mlp_layout_refusal

        return mlp_layout_refusal(fields)

    def gates(self, model, shared):
        if "ffn" not in shared:
            shared["ffn"] = FFNGates(model)
        return shared["ffn"]

    def units_per_layer(self, fields):
        value = fields.get("intermediate_size")
        return value if isinstance(value, int) else None

    def unit_grad(self, site, grad):
        from headprune.core.ffn.sites import FFNSite

        return (grad, site.neuron_ids, site.group) if isinstance(site, FFNSite) else None

    def kept_rows(self, model):
        from headprune.core.ffn.sites import ffn_sites_if_any

        rows = {}
        for site in ffn_sites_if_any(model):
            for path in site.up_paths():
                up = site.projection(path)
                if out_features(up) == len(site.neuron_ids):  # a fused gate/up projection holds two rows per neuron
                    rows[id(up)] = list(site.neuron_ids)
        return rows

    def unit_columns(self, site):
        from headprune.core.ffn.sites import FFNSite

        if not isinstance(site, FFNSite) or not site.neuron_ids:
            return None
        return site.down(), list(site.neuron_ids), [[p] for p in range(len(site.neuron_ids))]

    def flops_tables(self, model, seq_len):
        from headprune.core.flops_tables import ffn_flops_tables

        return ffn_flops_tables(model, seq_len)

    def covered_flops(self, cost):
        return cost.ffn_flops

    def latency_tables(self, head_tables, ffn_tables, model):
        return ffn_tables

    def prune(self, model, mask):
        from headprune.core.ffn.pruning import prune_ffn_mask

        return prune_ffn_mask(model, mask)

    def record(self, model):
        from headprune.core.ffn.pruning import ffn_record
        from headprune.core.ffn.sites import ffn_sites_if_any

        return ffn_record(model) if ffn_sites_if_any(model) else {}

    def save_meta(self, model):
        from headprune.core.ffn.saving import ffn_meta

        return ffn_meta(model) or None

    def restore(self, model, meta, path):
        from headprune.core.ffn.saving import rebuild_ffn

        rebuild_ffn(model, meta or {}, path)  # FFN widths per layer, by original neuron id

    def verify(self, model, meta, path):
        from headprune.core.ffn.saving import DIGESTS, ffn_digest
        from headprune.core.ffn.sites import ffn_sites_if_any
        from headprune.core.record_digests import check_digests

        check_digests(ffn_sites_if_any(model), (meta or {}).get(DIGESTS), ffn_digest, "feed-forward block", "neuron", path)
