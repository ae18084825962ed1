"""The attention kinds: query heads (``head``) and KV groups (``kv_group``: a KV head with all of its query heads)."""

from __future__ import annotations

import torch
from torch import nn

from headprune.core.families import GROUPS
from headprune.core.kinds.base import UnitKind


def _attention_site(site) -> bool:
    from headprune.core.gates import AttentionSite

    return isinstance(site, AttentionSite)


class HeadKind(UnitKind):
    """Query heads: a layer's attention keeps any subset of them (Michel et al.'s unit)."""

    name = "head"
    parts = ("attention",)
    noun = "head"
    config_fields = ("num_attention_heads",)
    attention_maps = True
    layer_normalized = True
    rearrangement = None
    recovery_parts = ("attention",)
    record_key = "heads"

    def owns(self, group: str) -> bool:
        return group in GROUPS

    def gates(self, model: nn.Module, shared: dict):
        from headprune.core.gates import HeadGates

        if "head" not in shared:
            shared["head"] = HeadGates(model)
        return shared["head"]

    def units_per_layer(self, fields: dict) -> int | None:
        value = fields.get("num_attention_heads")
        return value if isinstance(value, int) else None

    def unit_grad(self, site, grad):
        return (grad, site.head_ids, site.group) if _attention_site(site) else None

    def flops_tables(self, model, seq_len, attention_tables=None):
        from headprune.selection.costs import flops_cost_model

        return attention_tables if attention_tables is not None else flops_cost_model(model, seq_len).tables

    def latency_tables(self, head_tables, ffn_tables, model):
        return head_tables

    def prune(self, model, mask):
        from headprune.core.pruning import prune_mask

        return prune_mask(model, mask)

    def record(self, model):
        from headprune.core.pruning import pruning_record

        return pruning_record(model)


class KVGroupKind(HeadKind):
    """KV groups: a KV head with all of its query heads, gated by one shared gate (grouped-query attention)."""

    name = "kv_group"
    noun = "KV group"
    config_fields = ("num_key_value_heads",)

    def gates(self, model, shared):
        from headprune.core.units import kv_group_view

        return kv_group_view(HeadKind.gates(self, model, shared))

    def units_per_layer(self, fields):
        from headprune.models.sources import kv_heads_per_layer

        return kv_heads_per_layer(fields)

    def unit_grad(self, site, grad):
        if not _attention_site(site):
            return None
        positions = torch.tensor(site.kv_positions(), device=grad.device)
        summed = grad.new_zeros(*grad.shape[:2], len(site.kv_ids)).index_add_(2, positions, grad)  # (B, T, KV)
        return summed, site.kv_ids, site.group  # the gradient of one gate shared by a KV head's query heads

    def flops_tables(self, model, seq_len, attention_tables=None):
        from headprune.selection.costs import kv_group_flops_cost_model

        return kv_group_flops_cost_model(model, seq_len).tables

    def latency_tables(self, head_tables, ffn_tables, model):
        from headprune.core.gates import HeadGates

        per_kv = HeadGates(model).heads_per_kv  # k KV groups kept = k x heads_per_kv query heads
        return {g: t[:, :: per_kv[g]].clone() for g, t in head_tables.items()}

    def prune(self, model, mask):
        from headprune.core.pruning import prune_mask

        return prune_mask(model, mask)  # the gates hand over the query-head mask of the KV-group mask
