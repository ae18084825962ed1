"""The hidden kind: channels of the residual stream, one width for the network; masks {"hidden": [1, d]} or [batch, 1, d]."""

from headprune.core.families import family_of_type
from headprune.core.hidden.pruning import (
    build_width,
    hidden_flops_tables,
    hidden_meta,
    hidden_record,
    hidden_width_multiple,
    prune_hidden_mask,
    rebuild_hidden,
)
from headprune.core.hidden.sites import GROUP, HiddenSite, channel_book, family_refusal, hidden_group, hidden_refusal, hidden_sites
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.site_gates import ModelWideGates


class HiddenGates(ModelWideGates):
    """Gates on every residual channel of a model: one [1, d] group named ``hidden``, its gate on every site of the stream."""

    unit, noun = "hidden", "channel"
    find, refusal = staticmethod(hidden_sites), staticmethod(hidden_refusal)


class HiddenKind(UnitKind):
    """Channels of the residual stream: one coupled group from the embeddings to the head, one width for every layer."""

    name, noun, parts, groups, config_fields = "hidden", "channel", ("residual",), (GROUP,), ("hidden_size",)
    unit_fields = ("hidden_size", "d_model", "n_embd")
    ablation = (
        "removing one residual channel at a time is no useful pruning order: the stream holds hundreds to thousands of channels, "
        "each alone moves the output by a small share, below the noise of an evaluation split, and the order would need one "
        "evaluation per channel; score channels from gradients instead (prune.order=importance or fisher: one backward pass for all)"
    )
    rearrangement = (
        "hidden channels form one group of one layer shared by the whole network: rearrangement re-chooses units within each "
        "layer's count, and the one width of the stream leaves nothing per layer to re-choose"
    )
    reconstruction = None  # the projections that read the stream are re-solved on the kept channels, those that write it on their rows
    resolves_kept_rows = True  # a reader alone leaves its errors in the stream; the writers' kept rows take them up
    lsq_conflict = (
        "least-squares recovery rescales heads and neurons against the unpruned layer's output at the same residual width, and "
        "removed channels change that width: use prune.recover=reconstruct"
    )
    floor_units = None
    group_floor = 1  # the residual stream keeps a channel
    layer_rows = False  # one row for the whole stream
    width_setting = "hidden_multiple"
    covered_costs = ("hidden_flops",)
    rebuild_order = 30
    legacy_keys = ("hidden_size_orig", "pruned_channels")
    gates_class, site_class = HiddenGates, HiddenSite
    prune, record, flops_tables = staticmethod(prune_hidden_mask), staticmethod(hidden_record), staticmethod(hidden_flops_tables)
    save_meta, build_config, restore = staticmethod(hidden_meta), staticmethod(build_width), staticmethod(rebuild_hidden)
    available, width_multiple = staticmethod(hidden_refusal), staticmethod(hidden_width_multiple)

    def kept_rows(self, model):
        if not hidden_record(model):
            return {}
        return {id(writer): list(channel_book(model)["ids"]) for writer in hidden_group(model).writers}

    def surgeon_blocks(self, model, gates):
        ids = list(channel_book(model)["ids"])  # one greedy for the stream: a channel is a column of every projection reading it
        return [(GROUP, 0, hidden_group(model).readers, ids, [[p] for p in range(len(ids))])]

    def refusal(self, fields, settings):
        reason = family_refusal(family_of_type(fields.get("model_type")), fields.get("model_type"))
        if reason:  # the model's own refusal, said before work
            return reason
        if fields.get("model_type") == "marian":
            return (
                "Marian's sinusoidal positions enter the residual stream without a batch axis, so the per-example channel "
                "masks of its generation passes cannot be applied: prune its heads, neurons or layers, or use a T5 model"
            )
        return None
