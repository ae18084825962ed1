"""What a kind of pruning unit is: one class per kind, registered by name; everything outside core/ asks the kind."""

import math
from typing import Any

import torch
from torch import nn


class UnitKind:
    """One kind of pruning unit. Subclass it, set the attributes, implement the methods, then ``register_kind(kind)``."""

    name: str = ""  # the value of prune.unit: "head", "kv_group", "ffn", "block", "hidden", "layer"
    parts: tuple[str, ...] = ()  # the parts of the model whose units it removes ("attention", "feed_forward", "residual", "depth")
    noun: str = "unit"  # one unit, in messages
    config_fields: tuple[str, ...] = ()  # the model config fields it shrinks
    unit_fields: tuple[str, ...] = ()  # the config fields holding its units per layer, the first that is set (``units_per_layer``)
    groups: tuple[str, ...] = ()  # the mask groups it owns (``owns``, ``group_names``; empty: it implements them itself)
    ablation: str | None = None  # why removing one unit at a time is no useful order (None: it is one)
    keep_one: str | None = None  # why keeping one unit per layer is no useful measure (None: it is one)
    attention_maps: bool = False  # its units have attention maps (the entropy and retrieval orders read them)
    layer_normalized: bool = False  # Michel et al.'s per-layer L2 norm of scores suits it (heads of a layer)
    rearrangement: str | None = "it has no rearrangement"  # why it cannot be rearranged (None: it can)
    reconstruction: str | None = "it has no layer-wise reconstruction"  # why prune.recover=reconstruct cannot follow (None: it can)
    reconstruction_alone: str | None = None  # why a unit of this kind alone leaves nothing to re-solve (None: it does not)
    resolves_kept_rows: bool = False  # reconstruction re-solves the projections it shrank by rows alone, on their kept rows
    writer_keeps_bias: bool = False  # a removed unit's writer still runs on its bias, which takes its mean output (obs prices the rest)
    lsq_conflict: str | None = None  # why least-squares recovery cannot run on a unit that holds this kind (None: it can)
    recovery_parts: tuple[str, ...] = ()  # the parts least-squares recovery refits after its units go
    layout_refusal: dict[str, str] = {}  # {prune.layout value: why this kind refuses it}
    rearrange_by: str | None = None  # how its rearrangement is computed: "fisher_blocks" (a U x U block per layer) or "gradients"
    multiple_setting: str | None = None  # the prune setting that rounds its per-layer counts up to a multiple (runtimes' tiles)
    width_setting: str | None = None  # the prune setting that rounds its kept count to a multiple the model's config accepts
    layer_rows: bool = True  # its masks hold one row per layer (the residual stream's one row is not a layer's)
    floor_units: int | None = 1  # prune.min_units_per_layer counts these (None: the floor does not apply, ``layer_floor``)
    group_floor: int = 0  # the fewest units one of its mask groups keeps in all (a layer stack, the residual stream)
    record_key: str = ""  # its key in pruning records (default: its name)
    rebuild_order: int = 100  # save_pruned / load_pruned visit kinds by this rank: depth (layers) first, then widths, then the rest
    legacy_keys: tuple[str, ...] = ()  # its entries at the top level of a headprune_pruning.json written before kinds had their own
    gates_class: type | None = None  # the class of what ``gates`` returns: register_kind checks it has the Gates protocol's methods
    site_class: type | None = None  # the class of its sites, whose probe gradients ``unit_grad`` reads as they are
    covered_costs: tuple[str, ...] = ()  # the ``ModelCost`` fields its tables cover (``covered_flops``; none: all they hold)

    def export_refusal(self, fmt: str) -> str | None:
        """Why export format ``fmt`` cannot write this kind's removals yet (None: it can)."""
        return None

    text_floor: bool = False  # its floor can keep every token a text uses (prune.vocab_text)
    renumbers_ids: bool = False  # its exported files speak other token ids than the task's tokenizer (``export_ids``)

    def export_ids(self, model: nn.Module) -> tuple[list[int], int] | None:
        """(the original token ids the exported files' ids 0, 1, ... stand for, the original id count); None: the ids stay."""
        return None

    def held_ids(self, model: nn.Module) -> tuple[list[int], int] | None:
        """(the original token ids a pruned model holds, the original id count), by an id view or its own; None: every id."""
        return None

    def export_tokenizer(self, model: nn.Module, tokenizer):
        """The tokenizer the exported files ship beside ``model``'s weights (the model's own unless this kind renumbers ids)."""
        return tokenizer

    def to_export_ids(self, model: nn.Module) -> None:
        """Make a pruned copy read and write the ids its exported files speak (``export_ids``); nothing when the ids stay."""

    def owns(self, group: str) -> bool:
        """Whether a mask group holds units of this kind (one of its ``groups``)."""
        if not self.groups:
            raise NotImplementedError
        return group in self.groups

    def available(self, model: nn.Module) -> str | None:
        """Why this model has none of these units (None: it has them)."""
        return None

    def gates(self, model: nn.Module, shared: dict) -> Any:
        """The gates of this kind on ``model`` (a ``Gates``), made once into ``shared`` ({kind name: its gates on the model})."""
        if self.gates_class is None:
            raise NotImplementedError
        if self.name not in shared:
            shared[self.name] = self.gates_class(model)
        return shared[self.name]

    def group_names(self, attention_groups: list[str]) -> list[str]:
        """The mask groups this kind has in a model with these attention groups (``enc_self``, ``enc_dec``, ``dec_self``):
        its ``groups`` one per self-attention stack, or all of them where its masks hold no layer rows."""
        if not self.layer_rows:
            return list(self.groups)
        return [own for attention, own in zip(("enc_self", "dec_self"), self.groups) if attention in attention_groups]

    def units_per_layer(self, fields: dict) -> int | None:
        """Units one layer holds, from the model's config fields (None: not known from the config alone)."""
        return next((fields[name] for name in self.unit_fields if isinstance(fields.get(name), int)), None)

    def unit_grad(self, site, grad: torch.Tensor) -> tuple[torch.Tensor, list[int], str] | None:
        """A site's probe gradient (B, T, C) as per-unit gradients (B, T, U), their original ids and group; None: not this kind's site."""
        return (grad, site.unit_ids, site.group) if self.site_class and isinstance(site, self.site_class) else None

    def counted_scores(self, gates, site, mean_loss: float) -> tuple[torch.Tensor, list[int], str] | None:
        """A site's per-unit scores from what it counted while probing instead of probe gradients, on the loss scale (the
        rise of the mean loss per example, ``mean_loss`` being that loss now): ((U,), original ids, group); None: not counted."""
        return None

    def floor(self, gates, tokenizer, needed: list[int]) -> dict[str, torch.Tensor]:
        """{group: bool [layers, units]} of the units never removed (``needed``: token ids the task's labels and prompts use)."""
        return {}

    def ranked_scores(self, gates, tokenizer, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``scores`` (its floor at +inf) re-ranked so that the units any count of the highest keeps work without the rest (the vocabulary: every kept token's merge parts kept); default: as given."""
        return scores

    def unit_columns(self, site) -> tuple[nn.Module, list[int], list[list[int]]] | None:
        """(the projection that reads a site's units, their original ids, each unit's input columns of it); None: not its site."""
        return None

    def surgeon_blocks(self, model: nn.Module, gates) -> list[tuple[str, int, list[nn.Module], list[int], list[list[int]] | None]]:
        """(group, layer, projections whose inputs the units are, unit ids, each unit's input columns in every one of them; None:
        one unit, all their inputs) of each set of units the obs order prices together; default: ``unit_columns`` per site."""
        found = [(site, self.unit_columns(site)) for site in gates.sites]
        return [(site.group, site.layer, [c[0]], c[1], c[2]) for site, c in found if c is not None]

    @property
    def surgeon_priced(self) -> bool:
        """Whether the obs order can price this kind's units (it says which projections' inputs they are)."""
        return type(self).unit_columns is not UnitKind.unit_columns or type(self).surgeon_blocks is not UnitKind.surgeon_blocks

    def kept_rows(self, model: nn.Module) -> dict[int, list[int]]:
        """{id(projection): original ids of the output rows it keeps} of the projections whose outputs this kind shrank."""
        return {}

    def flops_tables(self, model: nn.Module, seq_len: int) -> dict[str, torch.Tensor]:
        """{group: [layers, units + 1]} FLOPs per example of ``seq_len`` tokens with 0..units kept, as the part costs in the whole model."""
        raise NotImplementedError

    def nested_rows(self, model: nn.Module) -> dict[tuple[str, int], list[tuple[str, int]]]:
        """{(group, layer) of a unit: the other kinds' (group, layer) rows it holds}; in a joint budget its table keeps only the rest."""
        return {}

    def covered_flops(self, cost) -> float | None:
        """The FLOPs of the model as it is (a ``ModelCost``) that this kind's tables cover, the rest being fixed (None: all they hold)."""
        return sum(getattr(cost, name) for name in self.covered_costs) if self.covered_costs else None

    def latency_parts(self) -> tuple[str, ...] | None:
        """The parts ("attention", "feed_forward") timed to make its latency tables (None: it has no latency tables)."""
        return None if type(self).latency_tables is UnitKind.latency_tables else self.parts

    def latency_tables(self, head_tables: dict | None, ffn_tables: dict | None, model: nn.Module) -> dict[str, torch.Tensor]:
        """{group: [layers, units + 1]} seconds with 0..units kept, from the measured head and FFN tables."""
        raise NotImplementedError(f"no latency tables for {self.name} units: use a FLOPs target")

    def query_head_rows(self, rows: list, fields: dict) -> list | None:
        """A mask group's rows [layers][units] as rows over the query heads they gate (None: it gates no attention heads)."""
        return None

    def width_multiple(self, model: nn.Module) -> int:
        """The least multiple of units a layer may keep for the model's stock config to build the pruned model (1: any count)."""
        return 1

    def layer_floor(self, min_units_per_layer: int) -> int:
        """The fewest of its units each layer keeps under prune.min_units_per_layer (0: that floor is not this kind's)."""
        return min_units_per_layer if self.floor_units is not None else 0

    def runtime_multiple(self, settings) -> int:
        """The multiple each layer's kept count rounds up to for runtimes' tiles, from the prune ``settings`` (1: none)."""
        return int(_setting(settings, self.multiple_setting) or 1) if self.multiple_setting else 1

    def kept_multiple(self, model: nn.Module, settings) -> int:
        """The multiple its kept count rounds to: the model config's rule and the prune ``settings``' one, their lcm (1: any count)."""
        if self.width_setting is None:
            return 1
        given = _setting(settings, self.width_setting)
        rule = self.width_multiple(model)
        return rule if given is None else math.lcm(rule, int(given))

    def refusal(self, fields: dict | None, settings: dict) -> str | None:
        """Why this kind cannot run on a model with these config ``fields`` and these prune ``settings`` (None: it can)."""
        return None

    def prune(self, model: nn.Module, mask: dict[str, torch.Tensor]) -> dict:
        """Remove from the weights every unit whose hard mask entry is 0; returns this kind's record."""
        raise NotImplementedError

    def record(self, model: nn.Module) -> dict:
        """This kind's removed units by original id, {group: {layer: [ids]}} (what save_pruned writes)."""
        return {}

    def recovery_refusal(self) -> str | None:
        """Why least-squares recovery refits nothing after this kind's units go (None: it refits ``recovery_parts``)."""
        if self.recovery_parts:
            return None
        return (
            f"least-squares recovery rescales the kept heads or neurons of a layer that lost some, and removing {self.noun}s "
            "leaves every layer's heads and neurons whole, so it would fit nothing"
        )

    def save_meta(self, model: nn.Module) -> dict | None:
        """What save_pruned writes under this kind's name in headprune_pruning.json (None: nothing); it may update the config first."""
        return None

    def finish_save(self, model: nn.Module, path, tokenizer) -> None:
        """After save_pruned wrote the weights and ``tokenizer`` (None: none) to ``path``: bring the saved files in line with them."""

    def build_config(self, config) -> None:
        """Before load_pruned builds a saved model from ``config``: set the config to the shape ``restore`` starts from."""

    def restore(self, model: nn.Module, meta: dict | None, path) -> None:
        """Rebuild the kind's structure on a fresh model before its weights load (``meta``: what ``save_meta`` wrote; None: no record)."""

    def verify(self, model: nn.Module, meta: dict | None, path) -> None:
        """After the weights load: a ValueError where they are not the ones this kind saved (``meta`` as for ``restore``)."""

    def removed(self, record: dict) -> int:
        """How many units a record of this kind removed."""
        return sum(len(ids) for layers in record.values() for ids in layers.values())

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def _setting(settings, name: str):
    """A prune setting by name, from the prune settings or a mapping {setting name: value} (None: not given)."""
    return settings.get(name) if isinstance(settings, dict) else getattr(settings, name, None)
