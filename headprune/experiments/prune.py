"""experiment=prune: greedy pruning across the network (paper section 4, Figure 2; section 5, Figure 3).

At each fraction f (0, 10%, ... 90% by default) the lowest-scoring f x N heads are masked and the
model is evaluated. Orders: ``importance`` (once, or re-estimated under the current mask before each
step with ``prune.reestimate=true``), ``ablation`` (the oracle order from single-head differences),
``entropy`` and ``random`` (seeded). Importance and entropy come from the training-split subset
(``task.importance_batches()``), never from the evaluation data.
"""
from __future__ import annotations

from headprune.experiments import common
from headprune.importance import attention_entropy, importance_scores
from headprune.ordering import (ablation_scores, check_fractions, check_groups, check_order, entropy_scores, fraction_grid,
                                greedy_mask, heads_removed, masks_for_fractions, n_to_prune, random_scores, ranked_heads)
from headprune.plots import pruning_curves


def fractions_of(settings) -> list[float]:
    """``prune.fractions`` (a number or a list) or the grid 0, step, ... max_fraction."""
    given = settings.get("fractions")
    if given is None:
        return fraction_grid(float(settings.step), float(settings.get("max_fraction", 0.9)))
    if isinstance(given, (int, float)):
        given = [given]
    return check_fractions(list(given))


def orders_of(settings) -> list[str]:
    given = settings.order
    orders = [given] if isinstance(given, str) else list(given)
    return [check_order(str(o)) for o in orders]


def importance_of(task, icfg, mask=None) -> dict:
    """Head importance on the task's training subset (the paper's estimator, switchable reductions)."""
    return importance_scores(task.model, task.gates, task.importance_batches(), reduce=str(icfg.reduce),
                             normalize_layers=bool(icfg.normalize_layers), normalize_global=bool(icfg.normalize_global), mask=mask)


def order_scores(task, order: str, icfg, seed: int, shared: dict, ablation_split: str, n_samples: int) -> dict:
    """The fixed score per head of one order (lower = pruned first), cached in ``shared``."""
    if order in shared:
        return shared[order]
    if order == "importance":
        scores = shared.setdefault("importance_raw", importance_of(task, icfg))
    elif order == "entropy":
        scores = entropy_scores(shared.setdefault("entropy_raw", attention_entropy(task.model, task.gates, task.importance_batches())))
    elif order == "random":
        scores = random_scores(task.gates.groups, seed)
    else:
        if "ablation_deltas" not in shared:
            from headprune.experiments.ablate import ablation_stage

            result = ablation_stage(task, ablation_split, None, n_samples=n_samples, seed=seed)
            shared["ablation_deltas"] = {g: __import__("torch").tensor(v) for g, v in result["delta"].items()}
        scores = ablation_scores(shared["ablation_deltas"])
    shared[order] = scores
    return scores


def reestimated_masks(task, icfg, fractions, groups, min_per_layer: int, progress: bool = True) -> list[dict]:
    """Masks for growing fractions, importance re-estimated under the current mask before each step."""
    from tqdm.auto import tqdm

    shape = task.gates.groups
    masks, current = [], None
    for fraction in tqdm(fractions, desc="re-estimate importance", disable=not progress, leave=False):
        scores = importance_of(task, icfg, mask=current)
        order = ranked_heads(scores, groups)
        current = greedy_mask(order, shape, n_to_prune(fraction, shape, groups), min_per_layer, start=current)
        masks.append(current)
    return masks


def prune_stage(task, orders, fractions, groups=None, min_per_layer: int = 0, reestimate: bool = False, icfg=None,
                split: str = "eval", seed: int = 0, shared: dict | None = None, ablation_split: str = "eval",
                n_samples: int = 1000, progress: bool = True, base=None) -> dict:
    """Score at every fraction for every order: {"orders": {order: {"steps": [...]}}, ...}."""
    shape = task.gates.groups
    groups = check_groups(groups, shape)
    shared = {} if shared is None else shared
    base = base or task.evaluate(None, split=split)
    out = {"metric": task.metric, "split": split, "n_examples": base.n, "base_score": base.score, "groups": groups,
           "total_heads": sum(shape[g][0] * shape[g][1] for g in groups), "min_heads_per_layer": min_per_layer,
           "reestimate": reestimate, "fractions": fractions, "orders": {}}
    for order in orders:
        if order == "importance" and reestimate:
            masks = reestimated_masks(task, icfg, fractions, groups, min_per_layer, progress)
        else:
            scores = order_scores(task, order, icfg, seed, shared, ablation_split, n_samples)
            masks = masks_for_fractions(scores, shape, fractions, groups, min_per_layer)
        results = common.evaluate_many(task, masks, split, desc=f"prune {order}", progress=progress)
        steps = [{"fraction": f, "heads_pruned": heads_removed(m), "score": r.score, "relative": r.score / base.score if base.score else None,
                  "mask": common.mask_to_json(m)} for f, m, r in zip(fractions, masks, results)]
        out["orders"][order] = {"steps": steps}
        if order in shared:
            out["orders"][order]["head_scores"] = common.tensor_dict(shared[order])
    return out


def prune_table(result: dict) -> tuple[list[str], list[list]]:
    columns = ["order", "groups", "fraction", "heads_pruned", "score"]
    rows = [[order, "+".join(result["groups"]), s["fraction"], s["heads_pruned"], s["score"]]
            for order, v in result["orders"].items() for s in v["steps"]]
    return columns, rows


def curves_of(result: dict, name_by: str = "order") -> dict:
    label = "+".join(result["groups"])
    return {(order if name_by == "order" else f"{label} ({order})"): ([s["fraction"] for s in v["steps"]], [s["score"] for s in v["steps"]])
            for order, v in result["orders"].items()}


def run(cfg) -> dict:
    """Greedy pruning curve(s); results.json holds every step's mask and score, plus a figure."""
    settings = cfg.prune
    orders = orders_of(settings)
    fractions = fractions_of(settings)
    min_per_layer = int(settings.get("min_heads_per_layer") or 0)
    if min_per_layer < 0:
        raise ValueError(f"prune.min_heads_per_layer must be >= 0, got {min_per_layer}")
    task = common.load_task(cfg)
    groups = check_groups(settings.get("groups"), task.gates.groups)
    split = str(settings.split)
    common.check_split(task, split)
    if "ablation" in orders:
        common.check_split(task, str(settings.ablation_split), "ablation")
    result = prune_stage(task, orders, fractions, groups, min_per_layer, bool(settings.reestimate), cfg.importance, split,
                         int(cfg.seed), ablation_split=str(settings.ablation_split), n_samples=int(settings.n_samples))
    out = common.output_dir(cfg)
    title = f"Greedy pruning of {'+'.join(groups)} ({cfg.model.name}, {split})"
    figure = pruning_curves(curves_of(result), out / "prune.png", title, result["metric"], result["base_score"])
    for order, v in result["orders"].items():
        print(f"{order}: " + " ".join(f"{100 * s['fraction']:.0f}%={s['score']:.2f}" for s in v["steps"]))
    common.write_results(cfg, "prune", result, task, split, figures=[figure])
    common.log_run(cfg, "prune", {k: v for k, v in result.items() if k != "orders"}, {"prune": prune_table(result)}, [figure])
    return {"objective": result["orders"][orders[0]]["steps"][-1]["score"], **result}
