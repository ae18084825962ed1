"""Cost models in any pruning unit: each kind of the unit gives its tables, one budget spans them all."""

import torch
from torch import nn

from headprune.core.counting import model_bytes, model_cost
from headprune.core.unit_kinds import kinds_of, unit_name
from headprune.core.units import PrunedCount
from headprune.selection.costs import CostModel


def unit_flops_cost_model(model: nn.Module, unit="head", seq_len: int = 128) -> CostModel:
    """Analytic FLOPs per example of ``seq_len`` tokens in ``unit`` (a kind or a list): the tables rank units by each kind's saving alone;
    a mask's cost is counted on a weightless copy pruned by it (``core.units.PrunedCount``), so kinds meeting in a projection multiply."""
    fixed, tables = flops_parts(model, unit, seq_len)
    info = {"seq_len": seq_len, "unit": unit_name(unit)}
    return CostModel("flops", fixed, tables, info=info, exact=PrunedCount(model, unit, seq_len))


def unit_bytes_cost_model(model: nn.Module, unit="head") -> CostModel:
    """Weight bytes one decoded token reads (``counting.model_bytes``, the KV cache excluded) in ``unit`` (a kind or a joint list).

    Each kind's FLOPs tables price it: a table's FLOPs per example of s tokens are 2 W s + A s^2 (W: the weights a token
    multiplies by, A: attention scores, which read no weights), so W = (4 FLOPs(1) - FLOPs(2)) / 4, times the bytes of a weight.
    A mask's cost is the pruned model's own ``model_bytes``, counted on a weightless copy pruned by it."""
    one, two = flops_parts(model, unit, 1), flops_parts(model, unit, 2)
    size = next(model.parameters()).element_size()
    tables = {g: weights_of(one[1][g], two[1][g]) * size for g in one[1]}
    whole = model_bytes(model)
    covered = (weights_of(model_cost(model, 1).flops, model_cost(model, 2).flops) - weights_of(one[0], two[0])) * size
    info = {"unit": unit_name(unit), "per": "decoded token", "kv_cache": "excluded"}
    return CostModel("bytes", float(whole - covered), tables, info=info, exact=PrunedCount(model, unit, measure=model_bytes))


def weights_of(one_token, two_tokens):
    """The weights multiplied by per token, from FLOPs of 1 and 2 tokens (2 W s + A s^2 at s = 1, 2)."""
    return (4 * one_token - two_tokens) / 4


def flops_parts(model: nn.Module, unit, seq_len: int) -> tuple[float, dict[str, torch.Tensor]]:
    """(the FLOPs no kind of ``unit`` covers, {group: [layers, units + 1]} each kind's FLOPs with 0..units kept) at ``seq_len``."""
    kinds = kinds_of(unit)
    per_kind = {kind.name: kind.flops_tables(model, seq_len) for kind in kinds}
    tables = {g: t for kind_tables in per_kind.values() for g, t in kind_tables.items()}
    for kind in kinds:  # a unit that holds other kinds' units (a whole layer): only the cost they do not hold
        for (group, layer), rows in kind.nested_rows(model).items():
            inner = sum(float(tables[g][row, -1]) for g, row in rows if g in tables and g not in per_kind[kind.name])
            tables[group][layer, -1] -= inner
    whole = model_cost(model, seq_len)
    covered = [kind.covered_flops(whole) for kind in kinds]
    fixed = float(whole.flops) - sum(
        float(c) if c is not None else sum(float(t[:, -1].sum()) for t in per_kind[kind.name].values()) for kind, c in zip(kinds, covered)
    )
    return fixed, tables
