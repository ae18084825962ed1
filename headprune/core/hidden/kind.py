"""The hidden kind: channels of the residual stream, one width for the network; masks {"hidden": [1, d]} or [batch, 1, d]."""

import torch
from torch import nn

from headprune.core.hidden.sites import GROUP, HiddenSite, channel_book, hidden_sites
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.masks import normalize_mask
from headprune.core.site_gates import SiteGateMethods

CHANNEL_ABLATION = (
    "removing one residual channel at a time is no useful pruning order: the stream holds hundreds to thousands of channels, "
    "each alone moves the output by a small share, below the noise of an evaluation split, and the order would need one "
    "evaluation per channel; score channels from gradients instead (prune.order=importance or fisher: one backward pass for all)"
)
NO_REARRANGEMENT = (
    "hidden channels form one group of one layer shared by the whole network: rearrangement re-chooses units within each "
    "layer's count, and the one width of the stream leaves nothing per layer to re-choose"
)
REFUSED_FAMILIES = {
    "whisper": "its encoder's stream starts from two audio convolutions and sinusoidal positions, outside the coupled group",
    "deberta-v2": "its relative-position embeddings have the residual width but feed the attention's position projections, not the stream",
}


class HiddenGates(SiteGateMethods):
    """Gates on every residual channel of a model: one [1, d] group named ``hidden``."""

    unit = "hidden"

    def __init__(self, model: nn.Module):
        self.model = model
        hidden_sites(model)

    @property
    def sites(self) -> list[HiddenSite]:
        return hidden_sites(self.model)  # found again: another kind's pruning may have replaced a projection

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        return {GROUP: (1, channel_book(self.model)["width_orig"])}

    def present(self) -> dict[str, torch.Tensor]:
        out = torch.zeros(1, channel_book(self.model)["width_orig"], dtype=torch.bool)
        out[0, channel_book(self.model)["ids"]] = True
        return {GROUP: out}

    def ones(self) -> dict[str, torch.Tensor]:
        return {GROUP: torch.ones(1, channel_book(self.model)["width_orig"])}

    def normalize_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        return normalize_mask(mask, self.groups, hard=hard, unit="channel")

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        return {"hidden": self.normalize_mask(mask, hard=hard)}

    def set_mask(self, mask) -> None:
        """Gate every channel by ``mask`` ({"hidden": [1, d] or [B, 1, d]}); ``None`` removes the gates."""
        value = None if mask is None else self.normalize_mask(mask).get(GROUP)
        ids = channel_book(self.model)["ids"]
        gate = None
        if value is not None:
            gate = value[..., 0, :].index_select(-1, torch.tensor(ids, dtype=torch.long, device=value.device))
        for site in self.sites:
            site.gate = gate

    def remove(self) -> None:
        self.set_mask(None)

    def describe(self) -> str:
        book = channel_book(self.model)
        return f"{GROUP:9s} residual channels={book['width_orig']} present={len(book['ids'])} sites={len(self.sites)}"


class HiddenKind(UnitKind):
    """Channels of the residual stream: one coupled group from the embeddings to the head, one width for every layer."""

    name = "hidden"
    parts = ("residual",)
    noun = "channel"
    config_fields = ("hidden_size",)
    ablation = CHANNEL_ABLATION
    rearrangement = NO_REARRANGEMENT
    reconstruction = None  # the projections that read the stream are re-solved on the kept channels, those that write it on their rows
    lsq_conflict = (
        "least-squares recovery rescales heads and neurons against the unpruned layer's output at the same residual width, and "
        "removed channels change that width: use prune.recover=reconstruct"
    )
    floor_units = None
    group_floor = 1  # the residual stream keeps a channel
    layer_rows = False  # one row for the whole stream
    record_key = "hidden"
    width_setting = "hidden_multiple"
    rebuild_order = 30
    legacy_keys = ("hidden_size_orig", "pruned_channels")
    gates_class = HiddenGates

    def kept_rows(self, model):
        from headprune.core.hidden.sites import IDS_ATTR, hidden_group

        book = getattr(model, IDS_ATTR, None)
        if not book or len(book["ids"]) == book["width_orig"]:
            return {}
        return {id(writer): list(book["ids"]) for writer in hidden_group(model).writers}

    def recovery_refusal(self):
        return (
            "least-squares recovery rescales the kept heads or neurons of a layer that lost some, and removing residual "
            "channels keeps every head and neuron: it would fit nothing"
        )

    def owns(self, group: str) -> bool:
        return group == GROUP

    def group_names(self, attention_groups):
        return [GROUP]

    def refusal(self, fields, settings):
        if fields.get("model_type") == "marian":
            return (
                "Marian's sinusoidal positions enter the residual stream without a batch axis, so the per-example channel "
                "masks of its generation passes cannot be applied: prune its heads, neurons or layers, or use a T5 model"
            )
        return None

    def width_multiple(self, model):
        from headprune.core.hidden.pruning import config_width_multiple

        return config_width_multiple(model.config)

    def available(self, model):
        from headprune.core.families import family_for
        from headprune.core.hidden.sites import hidden_group

        reason = REFUSED_FAMILIES.get(family_for(model).name)
        if reason:
            return f"the residual channels of {model.config.model_type} models cannot be removed exactly: {reason}"
        try:
            hidden_group(model)
        except ValueError as err:
            return str(err)
        return None

    def gates(self, model, shared):
        if "hidden" not in shared:
            reason = self.available(model)
            if reason:
                raise ValueError(reason)
            shared["hidden"] = HiddenGates(model)
        return shared["hidden"]

    def units_per_layer(self, fields):
        value = fields.get("hidden_size", fields.get("d_model", fields.get("n_embd")))
        return value if isinstance(value, int) else None

    def unit_grad(self, site, grad):
        return (grad, site.channel_ids, GROUP) if isinstance(site, HiddenSite) else None

    def flops_tables(self, model, seq_len):
        from headprune.core.hidden.pruning import hidden_flops_tables

        return hidden_flops_tables(model, seq_len)

    def covered_flops(self, cost):
        covered = getattr(cost, "hidden_flops", None)
        if covered is None:
            raise NotImplementedError(
                "the FLOPs the hidden kind covers need the model: hidden_pruning.channel_flops(model, seq_len) * width"
            )
        return covered

    def prune(self, model, mask):
        from headprune.core.hidden.pruning import prune_hidden_mask

        return prune_hidden_mask(model, mask)

    def record(self, model):
        from headprune.core.hidden.pruning import hidden_record

        return hidden_record(model)

    def save_meta(self, model):
        from headprune.core.hidden.pruning import hidden_meta

        return hidden_meta(model) or None

    def build_config(self, config):
        from headprune.core.hidden.pruning import build_width

        build_width(config)  # built at its original residual width, then sliced by ``restore``

    def restore(self, model, meta, path):
        from headprune.core.hidden.pruning import rebuild_hidden

        rebuild_hidden(model, path)  # residual channels, by original id (config.json holds the record)
