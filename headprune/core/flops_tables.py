"""Analytic FLOPs tables per kind: {group: [layers, units + 1]}, the cost of a layer's part with 0..units kept."""

import torch
from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.counting import neuron_flops
from headprune.core.ffn.sites import find_ffn_sites
from headprune.core.projections import in_features, out_features
from headprune.core.site_gates import unit_groups


def head_flops(site, seq_len: int, heads: int = 1) -> int:
    """Forward FLOPs of ``heads`` query heads of an attention module and their one KV head: their q/k/v rows, output columns
    and scores (a KV group of grouped-query attention: ``heads`` = its query heads)."""
    query, key, value = (in_features(site.linear(w)) for w in ("query", "key", "value"))
    rows = heads * (query + out_features(site.linear("output"))) + key + value
    return 2 * seq_len * site.head_dim * rows + 2 * 2 * seq_len * seq_len * site.head_dim * heads  # q k^T and probs @ v


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
        flops = torch.arange(site.num_kv_heads_orig + 1).double() * head_flops(site, seq_len, site.heads_per_kv)
        flops[0] = head_flops(site, seq_len)  # the phantom: one query head, one KV head
        return flops

    return site_tables(find_sites(model), kept, lambda s: s.num_kv_heads_orig)


def ffn_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{FFN group: [layers, neurons + 1]}: a block's FLOPs with n neurons kept (0 kept: the phantom neuron)."""
    return site_tables(find_ffn_sites(model), lambda s: torch.arange(s.width_orig + 1).clamp(min=1).double() * neuron_flops(s, seq_len))
