"""The block kind: a layer's whole attention block, or its whole feed-forward block, one unit each."""

import torch

from headprune.core.attention.kind import _attention_site
from headprune.core.block.gates import BlockGates, block_group
from headprune.core.families import FFN_GROUPS, GROUPS
from headprune.core.ffn.sites import FFNSite, ffn_sites_if_any, mlp_layout_refusal
from headprune.core.kinds.kind_registry import KINDS
from headprune.core.kinds.unit_kind import UnitKind


def _ends(tables: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{"<group>_block": [layers, 2]}: each sub-block emptied (entry 0 of its unit table) or whole (the last entry)."""
    return {block_group(g): torch.stack([t[:, 0], t[:, -1]], dim=1) for g, t in tables.items()}


class BlockKind(UnitKind):
    """Whole attention and feed-forward blocks: one gate per sub-block of each layer."""

    name, noun, parts = "block", "block", ("attention", "feed_forward")
    groups = tuple(block_group(g) for g in (*GROUPS, *FFN_GROUPS))  # every attention and FFN group's "<group>_block"
    rearrangement = (
        "a block unit is one whole attention or FFN block per layer, and rearrangement keeps each layer's count while "
        "it re-chooses which units go: with one unit there is nothing to re-choose"
    )
    reconstruction = None  # a removed block's projections read no input: its mean output is folded into their biases
    writer_keeps_bias = True
    keep_one = (
        "keep-one keeps each layer's best unit of a group and removes the rest, and a block group holds one unit per layer: "
        "it would remove nothing and report the unpruned score for every layer"
    )
    recovery_parts = ("attention", "feed_forward")
    covered_costs = ("attention_flops", "ffn_flops")
    gates_class = BlockGates
    units_per_layer, refusal = staticmethod(lambda fields: 1), staticmethod(mlp_layout_refusal)
    layout_refusal = {
        "uniform": "prune.unit=block with prune.layout=uniform would remove the same blocks' share from every layer, one unit per "
        "layer and sub-block: it would remove every attention or every FFN block at once; use prune.layout=global"
    }

    def group_names(self, attention_groups):
        return [block_group(g) for g in (*attention_groups, *KINDS["ffn"].group_names(attention_groups))]

    def gates(self, model, shared):
        heads = KINDS["head"].gates(model, shared)
        ffn = KINDS["ffn"].gates(model, shared) if ffn_sites_if_any(model) else None
        return BlockGates(model, heads=heads, ffn=ffn)

    def unit_grad(self, site, grad):
        if not (_attention_site(site) or isinstance(site, FFNSite)):
            return None  # another kind's site in a joint unit (a layer, the residual stream)
        return grad.sum(-1, keepdim=True), [0], block_group(site.group)  # one gate shared by the block's heads or neurons

    def surgeon_blocks(self, model, gates):
        attention = [(s, s.linear("output")) for s in gates.sites if _attention_site(s) and s.head_ids]
        ffn = [(s, s.down()) for s in gates.sites if isinstance(s, FFNSite) and s.neuron_ids]
        return [(block_group(s.group), s.layer, [writer], [0], None) for s, writer in attention + ffn]  # a block: all its writer's inputs

    def flops_tables(self, model, seq_len):
        tables = _ends(KINDS["head"].flops_tables(model, seq_len))
        if ffn_sites_if_any(model):
            tables.update(_ends(KINDS["ffn"].flops_tables(model, seq_len)))
        return tables

    def latency_tables(self, head_tables, ffn_tables, model):
        return {**_ends(head_tables), **_ends(ffn_tables or {})}

    def prune(self, model, mask):
        raise AssertionError("block masks act as head and neuron masks (BlockGates.base_masks)")
