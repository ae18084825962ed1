"""The attention kinds: query heads (``head``) and KV groups (``kv_group``: a KV head with all of its query heads)."""

import torch

from headprune.core.attention.gates import AttentionSite, HeadGates, find_sites
from headprune.core.attention.kv_groups import KVGroupGates
from headprune.core.attention.saving import head_meta, rebuild_heads, verify_heads
from headprune.core.counting import head_flops_tables, kv_group_flops_tables
from headprune.core.families import FAMILIES, GROUPS
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.pruning import prune_mask, pruning_record


def kv_heads_in_fields(fields: dict) -> int | None:
    """KV heads per layer of a grouped-query model's config fields (None: one KV head per query head)."""
    kv, heads = fields.get("num_key_value_heads", fields.get("num_kv_heads")), fields.get("num_attention_heads")
    if fields.get("multi_query") and not fields.get("new_decoder_architecture"):
        kv = 1  # Falcon's multi-query attention: one KV head for all query heads
    return int(kv) if isinstance(kv, int) and isinstance(heads, int) and kv < heads else None


def _attention_site(site) -> bool:
    return isinstance(getattr(site, "attention", site), AttentionSite)  # an attention site, or a streaming gate on one


class HeadKind(UnitKind):
    """Query heads: a layer's attention keeps any subset of them (Michel et al.'s unit)."""

    name, noun, parts, groups, config_fields = "head", "head", ("attention",), GROUPS, ("num_attention_heads",)
    attention_maps = True
    layer_normalized = True
    rearrangement = None
    reconstruction = None  # the output projection is re-solved on the kept heads' inputs
    rearrange_by = "fisher_blocks"
    recovery_parts = ("attention",)
    covered_costs = ("attention_flops",)
    record_key = "heads"
    rebuild_order = 10  # after removed layers: heads are recorded by original layer id
    legacy_keys = ("pruned_heads", "heads_present", "weights_sha256")
    gates_class = HeadGates
    prune, record, flops_tables = staticmethod(prune_mask), staticmethod(pruning_record), staticmethod(head_flops_tables)
    save_meta, restore, verify = staticmethod(head_meta), staticmethod(rebuild_heads), staticmethod(verify_heads)

    def group_names(self, attention_groups):
        return list(attention_groups)

    def units_per_layer(self, fields: dict) -> int | None:
        keys = dict.fromkeys(key for family in FAMILIES for key in family.config_head_counts)  # each family's head-count field
        return min((int(fields[key]) for key in keys if isinstance(fields.get(key), int)), default=None)

    def unit_grad(self, site, grad):
        return (grad, site.head_ids, site.group) if _attention_site(site) else None

    def query_head_rows(self, rows, fields):
        return rows

    def kept_rows(self, model):
        rows = {}
        for site in find_sites(model):
            q, k, v = (site.linear(w) for w in ("query", "key", "value"))
            if len({id(q), id(k), id(v)}) < 3 or not site.head_ids:
                continue  # a fused q/k/v projection: its rows are not one kind's
            d, kv = site.head_dim, site.kv_ids or site.head_ids
            rows[id(q)] = [h * d + i for h in site.head_ids for i in range(d)]
            rows[id(k)] = rows[id(v)] = [h * d + i for h in kv for i in range(d)]
        return rows

    def unit_columns(self, site):
        if not _attention_site(site) or not site.head_ids:
            return None
        d = site.head_dim
        return site.linear("output"), list(site.head_ids), [list(range(p * d, (p + 1) * d)) for p in range(len(site.head_ids))]

    def latency_tables(self, head_tables, ffn_tables, model):
        return head_tables


class KVGroupKind(HeadKind):
    """KV groups: a KV head with all of its query heads, gated by one shared gate (grouped-query attention)."""

    name, noun, config_fields = "kv_group", "KV group", ("num_key_value_heads",)
    legacy_keys = ()  # its removed groups are removed query heads: the head kind saves and restores them
    gates_class = KVGroupGates
    save_meta, restore, verify = UnitKind.save_meta, UnitKind.restore, UnitKind.verify
    flops_tables, units_per_layer = staticmethod(kv_group_flops_tables), staticmethod(kv_heads_in_fields)

    def refusal(self, fields, settings):
        if fields is not None and kv_heads_in_fields(fields) is None:
            return "prune.unit=kv_group needs grouped-query attention (fewer KV heads than query heads), and this model has one KV head per query head: use prune.unit=head"
        return None

    def gates(self, model, shared):
        heads = HeadKind().gates(model, shared)
        if not any(n > 1 for n in heads.heads_per_kv.values()):
            raise ValueError(
                "prune.unit=kv_group needs grouped-query attention (fewer KV heads than query heads); "
                f"this model has one KV head per query head ({heads.groups}): use prune.unit=head"
            )
        return KVGroupGates(heads)

    def unit_grad(self, site, grad):
        if not _attention_site(site):
            return None
        positions = torch.tensor(site.kv_positions(), device=grad.device)
        summed = grad.new_zeros(*grad.shape[:2], len(site.kv_ids)).index_add_(2, positions, grad)  # (B, T, KV)
        return summed, site.kv_ids, site.group  # the gradient of one gate shared by a KV head's query heads

    def unit_columns(self, site):
        heads = HeadKind.unit_columns(self, site)
        if heads is None:
            return None
        output, _, columns = heads
        kv = site.kv_positions()  # the KV position of every computed query head
        groups = [[c for p, cols in enumerate(columns) if kv[p] == j for c in cols] for j in range(len(site.kv_ids))]
        return output, list(site.kv_ids), groups

    def query_head_rows(self, rows, fields):
        n = int(fields["num_attention_heads"]) // int(fields["num_key_value_heads"])
        return [[v for v in row for _ in range(n)] for row in rows]  # repeat_kv's order: KV head k serves query heads k*n ..

    def latency_tables(self, head_tables, ffn_tables, model):
        n = HeadGates(model).heads_per_kv
        return {g: t[:, :: n[g]].clone() for g, t in head_tables.items()}  # [layers, KV + 1]: k groups kept = k x n heads
