"""Cost models in any pruning unit: a table per group for each kind the unit holds, one budget over all of them.

    cost(mask) = fixed + sum_groups sum_layers table[group][layer, units kept]

- head / kv_group: the attention tables of ``headprune.selection.costs`` (FLOPs) or ``headprune.selection.latency``;
- ffn: a block keeping n neurons costs max(n, 1) neurons (an emptied block computes its zero phantom neuron);
- block: [layers, 2], a sub-block emptied (its phantom head or neuron) or whole: the ends of its head or FFN table.

Latency tables of KV groups need no timing of their own: pruning query heads n..H-1 of every layer removes
exactly the KV groups k..KV-1 when n = k x heads_per_kv, so the KV-group table is every heads_per_kv-th entry
of the head table. ``fixed`` is the unit's attention cost model's own fixed cost (everything for ``ffn``) less
the FFN tables' full cost, so a head + FFN model predicts the head model's cost minus what the neurons save.
"""

from __future__ import annotations

import torch
from torch import nn

from headprune.core.counting import model_cost, neuron_flops
from headprune.core.ffn_sites import ffn_groups, find_ffn_sites
from headprune.core.unit_kinds import block_group, unit_kinds, unit_name
from headprune.selection.costs import CostModel, flops_cost_model, kv_group_flops_cost_model


def ffn_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{FFN group: [layers, neurons + 1]} analytic FLOPs of each block with n neurons kept (0 kept: the phantom neuron)."""
    sites = find_ffn_sites(model)
    tables = {g: torch.zeros(layers, width + 1, dtype=torch.float64) for g, (layers, width) in ffn_groups(sites).items()}
    for site in sites:
        kept = torch.arange(site.width_orig + 1).clamp(min=1).double()  # 0 kept = the phantom neuron
        tables[site.group][site.layer, : site.width_orig + 1] = kept * neuron_flops(site, seq_len)
    return tables


def block_tables(tables: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """{"<group>_block": [layers, 2]}: each sub-block emptied (entry 0 of its unit table) or whole (the last entry)."""
    return {block_group(g): torch.stack([t[:, 0], t[:, -1]], dim=1) for g, t in tables.items()}


def kv_group_tables(head_tables: dict[str, torch.Tensor], heads_per_kv: dict[str, int]) -> dict[str, torch.Tensor]:
    """{group: [layers, KV heads + 1]} from per-query-head tables [layers, heads + 1]: k KV groups kept = k x heads_per_kv heads."""
    return {g: t[:, :: heads_per_kv[g]].clone() for g, t in head_tables.items()}


def _full(tables: dict[str, torch.Tensor]) -> float:
    return sum(float(t[:, -1].sum()) for t in tables.values())


def combine_cost_model(
    unit, attention: CostModel | None, ffn_tables: dict[str, torch.Tensor] | None, whole: float = 0.0, cost_unit: str = "flops"
) -> CostModel:
    """The cost model of ``unit`` from an attention cost model (per query head, or per KV group for kv_group units) and the
    FFN tables: the tables of each kind the unit holds; ``fixed`` is what they leave of the attention model's total (without
    one, of ``whole``, in ``cost_unit``)."""
    kinds = unit_kinds(unit)
    cost_unit = attention.unit if attention is not None else cost_unit
    base_fixed = attention.fixed if attention is not None else whole
    tables: dict[str, torch.Tensor] = {}
    if "head" in kinds or "kv_group" in kinds:
        tables.update(attention.tables)
    if "block" in kinds:
        tables.update(block_tables(attention.tables))
    if "ffn" in kinds or "block" in kinds:
        if ffn_tables is None:
            raise ValueError(f"unit {unit_name(unit)} needs the FFN tables of the model")
        base_fixed -= _full(ffn_tables)
        tables.update(ffn_tables if "ffn" in kinds else block_tables(ffn_tables))
    info = {**((attention.info or {}) if attention is not None else {}), "unit": unit_name(unit)}
    return CostModel(cost_unit, float(base_fixed), tables, info=info)


def unit_flops_cost_model(model: nn.Module, unit="head", seq_len: int = 128) -> CostModel:
    """Analytic FLOPs per example of ``seq_len`` tokens in ``unit`` (a kind or a joint list); head and kv_group alone give
    ``flops_cost_model`` and ``kv_group_flops_cost_model`` themselves."""
    kinds = unit_kinds(unit)
    if kinds == ("head",):
        return flops_cost_model(model, seq_len)
    if kinds == ("kv_group",):
        return kv_group_flops_cost_model(model, seq_len)
    attention = None
    if "kv_group" in kinds:
        attention = kv_group_flops_cost_model(model, seq_len)
    elif "head" in kinds or "block" in kinds:
        attention = flops_cost_model(model, seq_len)
    ffn = ffn_flops_tables(model, seq_len) if ("ffn" in kinds or "block" in kinds) else None
    whole = float(model_cost(model, seq_len).flops)
    costs = combine_cost_model(kinds, attention, ffn, whole)
    costs.info = {**(costs.info or {}), "seq_len": seq_len}
    return costs
