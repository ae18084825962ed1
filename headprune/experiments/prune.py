"""experiment=prune: greedy pruning across the network (paper section 4, Figure 2; section 5, Figure 3).

At each fraction f (0, 10%, ... 90% by default) the lowest-scoring f x N heads are masked and the
model is evaluated. Orders come from ``headprune.experiments.orders.ORDERS`` (importance, ablation,
entropy, random); with ``prune.reestimate=true`` every order that can be recomputed (importance,
entropy) is re-estimated under the current mask before each step. Importance and entropy come from
the training-split subset (``task.importance_batches()``), never from the evaluation data.
"""

from __future__ import annotations

from headprune.core.checks import warn
from headprune.experiments.evaluation import check_split, evaluate_many, selection_split, unit_counts
from headprune.experiments.orders import ORDERS, OrderSettings, check_order, order_scores, order_settings
from headprune.experiments.prune_speed import for_speed, pareto_stage, recoveries_of
from headprune.experiments.settings import RunSettings, listed
from headprune.lightning.loggers import log_run
from headprune.results.points import percent, point_name, point_step, removed_fraction, step_label
from headprune.results.run_dir import mask_to_json, tensor_dict, write_results
from headprune.results.writer import output_dir
from headprune.selection.greedy import check_fractions, check_groups, fraction_grid, heads_removed
from headprune.selection.uniform import layout_mask, layout_masks
from headprune.tasks import registry
from headprune.viz.plots import pareto_figure, pruning_curves
from headprune.viz.tables import pareto_rows, prune_rows


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
    """``prune.order`` as a list of known orders."""
    orders = listed(settings.order)
    if not orders:
        raise ValueError(f"prune.order is empty: give at least one of {list(ORDERS)}")
    return [check_order(str(o)) for o in orders]


def reestimated_masks(
    task, order: str, settings: OrderSettings, fractions, groups, min_per_layer: int, progress: bool, layout: str
) -> list[dict]:
    """Masks for growing fractions, the order's scores re-estimated under the current mask before each step."""
    from tqdm.auto import tqdm

    shape = task.gates.groups
    masks, current = [], None
    for fraction in tqdm(fractions, desc=f"re-estimate {order}", disable=not progress, leave=False):
        scores = ORDERS[order].scores(task, settings, mask=current)
        current = layout_mask(scores, shape, fraction, groups, min_per_layer, layout, start=current)
        masks.append(current)
    return masks


def prune_stage(
    task,
    orders,
    fractions,
    settings: OrderSettings,
    groups,
    min_per_layer: int,
    reestimate: bool,
    split: str,
    shared: dict | None,
    layout: str,
    *,
    progress: bool,
    base=None,
) -> dict:
    """Score at every fraction for every order: {"orders": {order: {"steps": [...]}}, ...}; ``layout``: global or uniform."""
    shape = task.gates.groups
    groups = check_groups(groups, shape)
    shared = {} if shared is None else shared
    base = base or task.evaluate(None, split=split)
    reestimated = [order for order in orders if reestimate and ORDERS[order].reestimable]  # random and ablation cannot be
    out = {
        "metric": task.metric,
        "higher_is_better": bool(task.higher_is_better),
        "split": split,
        "n_examples": base.n,
        "base_score": base.score,
        "groups": groups,
        "total_heads": sum(shape[g][0] * shape[g][1] for g in groups),
        "min_heads_per_layer": min_per_layer,
        "reestimate": bool(reestimated),  # true only when some order was re-estimated
        "reestimated_orders": reestimated,
        "fractions": fractions,
        "layout": layout,
        "orders": {},
        **unit_counts(task.gates, groups),
    }
    for order in orders:
        if order in reestimated:
            masks = reestimated_masks(task, order, settings, fractions, groups, min_per_layer, progress, layout)
        else:
            scores = order_scores(task, order, settings, shared)
            masks = layout_masks(scores, shape, fractions, groups, min_per_layer, layout)
        results = evaluate_many(task, masks, split, desc=f"prune {order}", progress=progress)
        steps = [
            {
                "fraction": f,
                **what_was_removed(f, heads_removed(m), out["units_total"]),
                "heads_pruned": heads_removed(m),
                "query_heads_pruned": heads_removed(task.gates.head_mask(m)),
                "score": r.score,
                "relative": r.score / base.score if base.score else None,
                "mask": mask_to_json(m),
            }
            for f, m, r in zip(fractions, masks, results)
        ]
        out["orders"][order] = {"steps": steps, "reestimated": order in reestimated}
        if order in shared:
            out["orders"][order]["head_scores"] = tensor_dict(shared[order])
    return out


def what_was_removed(fraction: float, removed: int, total: int) -> dict:
    """``fraction_removed`` (of the units) and ``fraction_met``: whether it removed the round(fraction x total) units asked
    (a uniform layout's floor per layer or prune.min_heads_per_layer can leave fewer)."""
    return {"fraction_removed": removed / total if total else 0.0, "fraction_met": removed == int(round(fraction * total))}


def warn_unmet(result: dict) -> None:
    """One warning line per order whose steps removed fewer units than their fractions ask."""
    total, unit = result["units_total"], result["unit"]
    for order, v in result["orders"].items():
        unmet = [s for s in v["steps"] if s.get("fraction_met") is False]
        if unmet:
            shown = "; ".join(
                f"{percent(s['fraction'])} asks {int(round(s['fraction'] * total))} of {total} {unit}s, {s['heads_pruned']} removed"
                for s in unmet
            )
            warn(
                f"{order}: {shown}: the {result['layout']} layout or prune.min_heads_per_layer={result['min_heads_per_layer']} "
                "allows no more; each point is labelled by what it removed (fraction_removed in results.json)"
            )


def curves_of(result: dict) -> dict:
    """{order: (fractions removed, scores)} of a prune result, for the figure."""
    total = result.get("units_total")
    return {
        order: ([removed_fraction(s, total) for s in v["steps"]], [s["score"] for s in v["steps"]]) for order, v in result["orders"].items()
    }


def run_for_speed(cfg, settings: RunSettings, task, orders: list[str], fractions: list[float], split: str) -> dict:
    """Pruning for speed (``prune.target`` / ``schedule`` / ``recover``): Pareto points in results.json, a table and a figure."""
    from headprune.lightning.loggers import build_logger

    selection = selection_split(task, settings.prune.selection_split)
    check_split(task, selection, "selection")
    out = output_dir(cfg)
    logger = build_logger(cfg, job_type="prune") if "finetune" in recoveries_of(settings.prune) else False
    where = {"split": split, "selection": selection, "seed": int(cfg.seed)}
    result = pareto_stage(task, settings, order_settings(cfg), orders, fractions, where, out, logger)
    figure = pareto_figure(result, out / "pareto.png", f"Quality against speed ({cfg.model.name}, {split})")
    for p in result["points"]:
        print(
            f"{point_name(p):>22} {point_step(p):>14}: {p['score']:.2f}, predicted speed-up {p['predicted_speedup']:.2f}x"
            + (f", measured {p['measured']['speedup']:.2f}x" if p.get("measured") else "")
        )
    write_results(cfg, "prune", result, task, split, inputs={"selection_split": selection}, figures=[figure])
    log_run(cfg, "prune", {k: v for k, v in result.items() if k != "points"}, {"pareto": pareto_rows(result)}, [figure])
    best = max(result["points"][1:], key=lambda p: p["score"] if task.higher_is_better else -p["score"])
    return {"objective": best["score"], **result}


def run(cfg) -> dict:
    """Greedy pruning curve(s); results.json holds every step's mask and score, plus a figure."""
    settings = RunSettings.of(cfg)
    prune = settings.prune
    orders = orders_of(prune)
    fractions = fractions_of(prune)
    min_per_layer = int(prune.min_heads_per_layer)
    if min_per_layer < 0:
        raise ValueError(f"prune.min_heads_per_layer must be >= 0, got {min_per_layer}")
    task = registry.load_task(cfg)
    groups = check_groups(prune.groups, task.gates.groups)
    split = str(prune.split)
    check_split(task, split)
    if "ablation" in orders:
        check_split(task, str(prune.ablation_split), "ablation")
    if for_speed(prune):
        return run_for_speed(cfg, settings, task, orders, fractions, split)
    result = prune_stage(
        task,
        orders,
        fractions,
        order_settings(cfg),
        groups,
        min_per_layer,
        bool(prune.reestimate),
        split,
        None,
        str(prune.layout),
        progress=True,
    )
    out = output_dir(cfg)
    title = f"Greedy pruning of {'+'.join(groups)} ({cfg.model.name}, {split})"
    figure = pruning_curves(curves_of(result), out / "prune.png", title, result["metric"], result["base_score"])
    for order, v in result["orders"].items():
        print(f"{order} ({result['unit']}): " + " ".join(f"{step_label(s)}={s['score']:.2f}" for s in v["steps"]))
    warn_unmet(result)
    write_results(cfg, "prune", result, task, split, figures=[figure])
    log_run(cfg, "prune", {k: v for k, v in result.items() if k != "orders"}, {"prune": prune_rows(result)}, [figure])
    return {"objective": result["orders"][orders[0]]["steps"][-1]["score"], **result}
