"""Analytic FLOPs tables per kind: {group: [layers, units + 1]}, the cost of a layer's part with 0..units kept."""

import torch
from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.counting import neuron_flops
from headprune.core.ffn.sites import find_ffn_sites
from headprune.core.projections import in_features, out_features
from headprune.core.site_gates import unit_groups


def head_flops(site, seq_len: int) -> int:
    """Forward FLOPs of one head of an attention module: its q/k/v rows, output columns and scores."""
    projections = sum(in_features(site.linear(w)) for w in ("query", "key", "value")) + out_features(site.linear("output"))
    return 2 * seq_len * site.head_dim * projections + 2 * 2 * seq_len * seq_len * site.head_dim  # q k^T and probs @ v


def kv_group_flops(site, seq_len: int) -> int:
    """Forward FLOPs of one KV group of a grouped-query attention module: its query heads, their KV head and scores."""
    n = site.heads_per_kv
    rows = n * in_features(site.linear("query")) + in_features(site.linear("key")) + in_features(site.linear("value"))
    return 2 * seq_len * site.head_dim * (rows + n * out_features(site.linear("output"))) + 2 * 2 * seq_len * seq_len * site.head_dim * n


def site_tables(sites, kept_cost, units=lambda site: site.units_orig) -> dict[str, torch.Tensor]:
    """{group: [layers, units + 1]} over a list of sites: each site's row ``kept_cost(site)`` with 0, 1, ... units kept (0 past
    its own units; ``units``: a site's, in the original model)."""
    tables = {g: torch.zeros(layers, count + 1, dtype=torch.float64) for g, (layers, count) in unit_groups(sites, units).items()}
    for site in sites:
        row = kept_cost(site)
        tables[site.group][site.layer, : len(row)] = row
    return tables


def head_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{attention group: [layers, heads + 1]}: a layer's attention FLOPs with n query heads kept (0: the phantom head)."""
    return site_tables(find_sites(model), lambda s: torch.arange(s.num_heads_orig + 1).clamp(min=1).double() * head_flops(s, seq_len))


def kv_group_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{attention group: [layers, KV heads + 1]}: k KV groups kept compute k KV heads and their query heads."""

    def kept(site) -> torch.Tensor:
        flops = torch.arange(site.num_kv_heads_orig + 1).double() * kv_group_flops(site, seq_len)
        flops[0] = head_flops(site, seq_len)  # the phantom: one query head, one KV head
        return flops

    return site_tables(find_sites(model), kept, lambda s: s.num_kv_heads_orig)


def ffn_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{FFN group: [layers, neurons + 1]}: a block's FLOPs with n neurons kept (0 kept: the phantom neuron)."""
    return site_tables(find_ffn_sites(model), lambda s: torch.arange(s.width_orig + 1).clamp(min=1).double() * neuron_flops(s, seq_len))
