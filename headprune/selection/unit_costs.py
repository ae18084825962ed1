"""Cost models in any pruning unit: each kind of the unit gives its tables, one budget spans them all."""

from torch import nn

from headprune.core.counting import model_cost
from headprune.core.pruned_count import PrunedCount
from headprune.core.unit_kinds import kinds_of, unit_name
from headprune.selection.costs import CostModel


def unit_flops_cost_model(model: nn.Module, unit="head", seq_len: int = 128) -> CostModel:
    """Analytic FLOPs per example of ``seq_len`` tokens in ``unit`` (a kind or a joint list).

    The tables rank the units (each kind's saving alone); a mask's cost is the pruned model's own ``model_cost``, counted on a
    weightless copy pruned by it (``core.pruned_count``), so kinds that meet in one projection multiply instead of adding."""
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
    info = {"seq_len": seq_len, "unit": unit_name(unit)}
    return CostModel("flops", fixed, tables, info=info, exact=PrunedCount(model, unit, seq_len))
