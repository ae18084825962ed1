"""The greedy pruning stage (paper section 4, Figure 2): score every order's masks at each fraction."""

from headprune.core.checks import warn
from headprune.core.unit_kinds import is_joint, noun
from headprune.core.units import query_heads_of, units_asked
from headprune.measures.evaluation import evaluate_one, unit_counts
from headprune.results.points import (
    fraction_met,
    kinds_label,
    measures,
    percent,
    removed_fraction,
    score_fields,
    step_label,
    units_by_kind,
    what_was_removed,
)
from headprune.results.run_dir import mask_to_json, tensor_dict
from headprune.results.stream_points import action_record, examples_record, point_cost, streamed_label, streaming
from headprune.selection.greedy import check_fractions, check_groups, fraction_grid, heads_removed
from headprune.selection.joint_scale import comparable_scores
from headprune.selection.kept_widths import round_kept_widths, round_runtime_multiples, runtime_multiples, width_multiples
from headprune.selection.uniform import layout_mask, layout_masks
from headprune.settings import listed
from headprune.sources.orders import ORDERS, OrderSettings, check_order, order_scores, with_floor
from headprune.stages.own_tokenizer import scored_masks


def fractions_of(settings) -> list[float]:
    """``prune.fractions`` (a number or a list) or the grid 0, step, ... max_fraction."""
    if settings.fractions is None:
        grid = fraction_grid(float(settings.step), float(settings.max_fraction))
        if grid == [0.0] and float(settings.max_fraction) > 0:
            warn(
                f"prune.max_fraction={settings.max_fraction} is below prune.step={settings.step}: the only point is 0% "
                "(no unit removed); lower prune.step or give prune.fractions"
            )
        return grid
    return check_fractions(listed(settings.fractions))


def orders_of(settings) -> list[str]:
    """``prune.order`` as a list of known orders (an empty list is refused before work)."""
    return [check_order(str(o)) for o in listed(settings.order)]


def reestimated_masks(task, order: str, settings: OrderSettings, fractions, groups, min_per_layer: int, progress: bool, prune) -> list:
    """Masks for growing fractions in ``prune``'s layout, joint scale and widths, the scores re-estimated under each step's mask."""
    from tqdm.auto import tqdm

    layout, joint_scale, widths = str(prune.layout), str(prune.joint_scale), width_multiples(task.model, task.gates.unit, prune)
    shape = task.gates.groups
    masks, current = [], None
    for fraction in tqdm(fractions, desc=f"re-estimate {order}", disable=not progress, leave=False):
        scores = comparable_scores(with_floor(task, ORDERS[order].scores(task, settings, mask=current), settings.vocab_text), joint_scale)
        current = layout_mask(scores, shape, fraction, groups, min_per_layer, layout, start=current)
        current = round_kept_widths(current, scores, widths, task.gates.unit)
        masks.append(current)
    return masks


def prune_stage(
    task,
    prune,
    orders,
    fractions,
    settings: OrderSettings,
    split: str,
    shared: dict | None,
    *,
    progress: bool,
    reestimate: bool = False,
    base=None,
    groups=None,
    min_per_layer: int | None = None,
) -> dict:
    """Score at every fraction for every order: {"orders": {order: {"steps": [...]}}, ...} in ``prune``'s layout and joint scale.

    ``groups`` and ``min_per_layer`` default to ``prune``'s; per-layer counts round up to the unit's runtime multiples and its one
    kept width down to a width a stock config takes (headprune.selection.kept_widths)."""
    shape = task.gates.groups
    groups = check_groups(prune.groups if groups is None else groups, shape)
    min_per_layer = int(prune.min_units_per_layer if min_per_layer is None else min_per_layer)
    layout, joint_scale = str(prune.layout), str(prune.joint_scale)
    multiples, widths = runtime_multiples(task.gates.unit, prune), width_multiples(task.model, task.gates.unit, prune)
    shared = {} if shared is None else shared
    base = base or evaluate_one(task, None, split, "unpruned", progress=progress)
    reestimated = [order for order in orders if reestimate and ORDERS[order].reestimable]  # orders that can score under a mask
    out = {
        "metric": task.metric,
        "higher_is_better": bool(task.higher_is_better),
        "split": split,
        "n_examples": base.n,
        "base_score": base.score,
        **{f"base_{name}": value for name, value in measures(base).items()},  # LM: base_bits_per_byte, base_perplexity_per_byte
        "groups": groups,
        "min_units_per_layer": min_per_layer,
        "reestimate": bool(reestimated),  # true only when some order was re-estimated
        "reestimated_orders": reestimated,
        "fractions": fractions,
        "layout": layout,
        "orders": {},
        **unit_counts(task.gates, groups),
        **action_record(task),
        **examples_record(task, base, "base_per_example"),
    }
    # a step's label by kind: kinds_removed (``KV groups 25%, neurons 38%``), or streamed for a streaming task
    label_key, label_of = ("streamed", streamed_label) if streaming(task) else ("kinds_removed", kinds_label)
    for order in orders:
        if order in reestimated:
            masks = reestimated_masks(task, order, settings, fractions, groups, min_per_layer, progress, prune)
        else:
            scores = comparable_scores(order_scores(task, order, settings, shared), joint_scale)
            masks = layout_masks(scores, shape, fractions, groups, min_per_layer, layout)
            masks = [round_runtime_multiples(m, scores, multiples, task.gates.unit) for m in masks]
            masks = [round_kept_widths(m, scores, widths, task.gates.unit) for m in masks]
        results = scored_masks(task, masks, split, f"prune {order}", progress=progress)  # a vocabulary cut: through its tokenizer
        steps = [
            {
                "fraction": f,
                **what_was_removed(f, heads_removed(m), out["units_total"]),
                "units_removed": heads_removed(m),
                "query_heads_removed": heads_removed(query_heads_of(task.gates, m)),
                "units_by_kind": units_by_kind(mask_to_json(m), task.gates.unit),
                label_key: label_of(mask_to_json(m), task.gates.unit),
                **score_fields(r, base),  # a vocabulary cut: through its own tokenizer, relative per byte
                "mask": mask_to_json(m),
                **point_cost(task, m),
                **examples_record(task, r),
            }
            for f, m, r in zip(fractions, masks, results)
        ]
        out["orders"][order] = {"steps": steps, "reestimated": order in reestimated}
        if order in shared:
            out["orders"][order]["head_scores"] = tensor_dict(shared[order])
    return out


def warn_unmet(result: dict) -> None:
    """One warning line per order whose steps removed fewer units than their fractions ask."""
    total, units = result["units_total"], noun(result["unit"], plural=True)
    for order, v in result["orders"].items():
        unmet = [s for s in v["steps"] if s.get("fraction_met") is False]
        if unmet:
            shown = "; ".join(
                f"{percent(s['fraction'])} asks {units_asked(s['fraction'], total)} of {total} {units}, {s['units_removed']} removed"
                for s in unmet
            )
            warn(
                f"{order}: {shown}: a fraction rounds down to whole {units}, and the {result['layout']} layout, the kinds' floors "
                f"(a layer stack and the residual stream keep one) or prune.min_units_per_layer={result['min_units_per_layer']} "
                "allow no more; each point is labelled by what it removed (fraction_removed in results.json)"
            )


def step_text(step: dict, unit: str) -> str:
    """A step as printed: its label, and for a joint unit what each kind lost (``30% (KV groups 25%, neurons 38%)``)."""
    if step.get("streamed"):
        return step["streamed"] + ("" if fraction_met(step) else f" (asked {percent(step['fraction'])})")
    label = step_label(step)
    return f"{label} ({step['kinds_removed']})" if is_joint(unit) and step.get("kinds_removed") else label


def curves_of(result: dict) -> dict:
    """{order: (fractions removed, scores)} of a prune result, for the figure."""
    total = result.get("units_total")
    return {
        order: ([removed_fraction(s, total) for s in v["steps"]], [s["score"] for s in v["steps"]]) for order, v in result["orders"].items()
    }
