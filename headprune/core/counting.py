"""Parameter and FLOP counts, overall, for the attention modules and for the feed-forward blocks, and analytic FLOPs tables per kind."""

from dataclasses import dataclass

import torch
from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.ffn.sites import FFNSite, ffn_sites_if_any, find_ffn_sites
from headprune.core.projections import in_features, is_projection, out_features
from headprune.core.site_gates import unit_groups


@dataclass
class ModelCost:
    """Sizes and forward FLOPs of one example of ``seq_len`` tokens (multiply-add = 2 FLOPs)."""

    parameters: int
    attention_parameters: int
    heads: int
    flops: int
    attention_flops: int
    seq_len: int
    ffn_parameters: int = 0  # the up / gate / down projections of the feed-forward blocks
    ffn_flops: int = 0  # their forward FLOPs, by the width each block computes (part of ``flops``)
    neurons: int = 0  # FFN neurons present, all blocks
    hidden_flops: int = 0  # the forward FLOPs of every projection reading or writing the residual stream (linear in its width)


def model_cost(model: nn.Module, seq_len: int = 128) -> ModelCost:
    """Parameters and analytic forward FLOPs for one example (source and target both ``seq_len`` tokens)."""
    from headprune.core.hidden.pruning import channel_flops
    from headprune.core.hidden.sites import hidden_width

    sites = find_sites(model)
    attention = {id(projection): projection for site in sites for projection in site.projections()}
    attention_flops = sum(site_flops(site, seq_len) for site in sites)
    other_linear = sum(
        2 * in_features(m) * out_features(m) * seq_len for m in model.modules() if is_projection(m) and id(m) not in attention
    )
    try:  # the projections on the residual axis (headprune.core.hidden.pruning); 0 where its channels form no group
        hidden_flops = channel_flops(model, seq_len) * hidden_width(model)
    except ValueError:
        hidden_flops = 0
    ffn_sites = ffn_sites_if_any(model)
    ffn_projections = [site.projection(p) for site in ffn_sites for p in site.up_paths()] + [site.down() for site in ffn_sites]
    return ModelCost(
        parameters=sum(p.numel() for p in model.parameters()),
        attention_parameters=sum(p.numel() for projection in attention.values() for p in projection.parameters()),
        heads=sum(len(s.head_ids) for s in sites),
        flops=other_linear + attention_flops,
        attention_flops=attention_flops,
        seq_len=seq_len,
        ffn_parameters=sum(p.numel() for m in ffn_projections for p in m.parameters()),
        ffn_flops=sum(2 * in_features(m) * out_features(m) * seq_len for m in ffn_projections),
        neurons=sum(site.width for site in ffn_sites),
        hidden_flops=hidden_flops,
    )


def site_flops(site, seq_len: int) -> int:
    """Forward FLOPs of one attention module for one example: its projections and, per computed head, q k^T and probs @ v."""
    projections = sum(2 * in_features(p) * out_features(p) * seq_len for p in site.projections())
    return projections + 2 * 2 * seq_len * seq_len * site.computed_heads * site.head_dim  # the phantom counts


def neuron_flops(site: FFNSite, seq_len: int) -> int:
    """Forward FLOPs of one neuron of a feed-forward block: its rows of every up projection and its down column."""
    rows = sum(in_features(site.projection(p)) for p in site.up_paths()) * site.layout.blocks
    return 2 * seq_len * (rows + out_features(site.down()))


def model_bytes(model: nn.Module) -> int:
    """Weight bytes one token reads in a forward step (a decoded token; a token of an encoder's input), the KV cache excluded: every
    parameter it multiplies by whole, one row of an untied input embedding (a lookup), a tied one whole once as the output head."""
    projected = {id(p) for m in model.modules() if is_projection(m) for p in m.parameters(recurse=False)}
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        for param in module.parameters(recurse=False):
            if id(param) not in seen:
                seen.add(id(param))
                lookup = isinstance(module, nn.Embedding) and id(param) not in projected
                total += (param.shape[-1] if lookup else param.numel()) * param.element_size()  # a lookup: one row (dim,)
    return total


def kv_cache_bytes_per_token(model: nn.Module, ideal: bool = False) -> int:
    """Bytes the decoder's self-attention KV cache holds per token of context (K and V, every layer, one sequence)."""
    sites = [site for site in find_sites(model) if site.group == "dec_self"]  # an encoder caches nothing; cross-attention: per source token
    return sum(  # K and V: (KV heads, head_dim) per token
        2 * (len(site.kv_ids) if ideal else site.computed_kv_heads) * site.head_dim * site.linear("key").weight.element_size()
        for site in sites
    )


def head_flops(site, seq_len: int, heads: int = 1) -> int:
    """Forward FLOPs of ``heads`` query heads and their one KV head: q/k/v rows, output columns, scores (a KV group: its query heads)."""
    query, key, value = (in_features(site.linear(w)) for w in ("query", "key", "value"))
    rows = heads * (query + out_features(site.linear("output"))) + key + value
    return 2 * seq_len * site.head_dim * rows + 2 * 2 * seq_len * seq_len * site.head_dim * heads  # q k^T and probs @ v


def site_tables(sites, kept_cost, units=lambda site: site.units_orig) -> dict[str, torch.Tensor]:
    """{group: [layers, units + 1]}: each site's row ``kept_cost(site)`` with 0, 1, ... units kept (0 past its own ``units``)."""
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
