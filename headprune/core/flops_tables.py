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


def _empty_tables(sites, units=lambda site: site.units_orig) -> dict[str, torch.Tensor]:
    """{group: zeros [layers, units + 1]} over a list of sites (``units``: a site's, in the original model)."""
    return {g: torch.zeros(layers, count + 1, dtype=torch.float64) for g, (layers, count) in unit_groups(sites, units).items()}


def head_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{attention group: [layers, heads + 1]}: a layer's attention FLOPs with n query heads kept (0: the phantom head)."""
    sites = find_sites(model)
    tables = _empty_tables(sites)
    for site in sites:
        kept = torch.arange(site.num_heads_orig + 1).clamp(min=1)  # 0 heads kept = the phantom head
        tables[site.group][site.layer, : site.num_heads_orig + 1] = kept.double() * head_flops(site, seq_len)
    return tables


def kv_group_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{attention group: [layers, KV heads + 1]}: k KV groups kept compute k KV heads and their query heads."""
    sites = find_sites(model)
    tables = _empty_tables(sites, lambda s: s.num_kv_heads_orig)
    for site in sites:
        kept = torch.arange(site.num_kv_heads_orig + 1).double() * kv_group_flops(site, seq_len)
        kept[0] = head_flops(site, seq_len)  # the phantom: one query head, one KV head
        tables[site.group][site.layer, : site.num_kv_heads_orig + 1] = kept
    return tables


def ffn_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{FFN group: [layers, neurons + 1]}: a block's FLOPs with n neurons kept (0 kept: the phantom neuron)."""
    sites = find_ffn_sites(model)
    tables = _empty_tables(sites)
    for site in sites:
        kept = torch.arange(site.width_orig + 1).clamp(min=1).double()  # 0 kept = the phantom neuron
        tables[site.group][site.layer, : site.width_orig + 1] = kept * neuron_flops(site, seq_len)
    return tables
