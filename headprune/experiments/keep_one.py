"""experiment=keep_one: in each layer keep only its best head (chosen on a selection split), report the drop.

Paper section 3.3 (Tables 2 and 3) with appendix A's protocol: the best head of a layer is the one
that scores highest on the *selection* split when it alone is kept; the drop is measured on the
*evaluation* split, so the choice is not biased by the test data.
"""

from __future__ import annotations

from dataclasses import asdict

from headprune.engine.ablation import keep_one_masks
from headprune.experiments.evaluation import check_split, evaluate_many, selection_split, unit_counts
from headprune.lightning.loggers import log_run
from headprune.results.run_dir import write_results
from headprune.results.writer import output_dir
from headprune.selection.greedy import check_groups
from headprune.tasks import registry
from headprune.viz.plots import keep_one_bars
from headprune.viz.tables import keep_one_rows


def keep_one_stage(
    task,
    selection: str,
    split: str,
    groups,
    n_samples: int,
    seed: int,
    alpha: float,
    *,
    progress: bool,
    base=None,
) -> dict:
    """Per layer: the best single head on ``selection``, and the score change on ``split`` with only it kept."""
    shape = task.gates.groups
    groups = check_groups(groups, shape)
    layers = [(g, l) for g in groups for l in range(shape[g][0])]
    candidates = [m for g, l in layers for m in keep_one_masks(shape, g, l)]
    selection_base = task.evaluate(None, split=selection)
    chosen_scores = evaluate_many(task, candidates, selection, desc=f"keep_one select ({selection})", progress=progress)
    best, masks, start = [], [], 0
    for group, layer in layers:
        n_heads = shape[group][1]
        scores = [r.score for r in chosen_scores[start : start + n_heads]]
        head = max(range(n_heads), key=lambda h: (scores[h], -h))
        best.append((group, layer, head, scores))
        masks.append(candidates[start + head])
        start += n_heads
    base = base or task.evaluate(None, split=split)
    results = evaluate_many(task, masks, split, desc=f"keep_one eval ({split})", progress=progress)
    tests = task.paired_test(base, results, n_samples=n_samples, seed=seed, alpha=alpha)
    rows = []
    for (group, layer, head, scores), res, test in zip(best, results, tests):
        rows.append(
            {
                "group": group,
                "layer": layer,
                "best_head": head,
                "selection_score": scores[head],
                "selection_scores": scores,
                "score": res.score,
                **asdict(test),
            }
        )
    return {
        "metric": task.metric,
        "selection_split": selection,
        "selection_base_score": selection_base.score,
        "split": split,
        "n_examples": base.n,
        "base_score": base.score,
        **unit_counts(task.gates, groups),
        "bootstrap": {"n_samples": n_samples, "seed": seed, "alpha": alpha},
        "rows": rows,
    }


def run(cfg) -> dict:
    """Keep only the best head per layer; write results.json, a bar chart and log to W&B."""
    settings = cfg.keep_one
    task = registry.load_task(cfg)
    selection = selection_split(task, settings.selection_split)
    split = str(settings.split)
    if selection == split:
        raise ValueError(f"keep_one.selection_split and keep_one.split are both {split!r}: choose the head on other data")
    check_split(task, split)
    check_split(task, selection, "selection")
    groups = check_groups(settings.groups, task.gates.groups)
    result = keep_one_stage(task, selection, split, groups, int(settings.n_samples), int(cfg.seed), float(settings.alpha), progress=True)
    out = output_dir(cfg)
    figure = keep_one_bars(
        result["rows"],
        out / "keep_one.png",
        f"Keep only the best head per layer ({cfg.model.name}, {split})",
        f"{result['metric']} difference",
    )
    for r in result["rows"]:
        print(f"{r['group']} layer {r['layer'] + 1}: keep head {r['best_head'] + 1} -> {r['delta']:+.2f} (p={r['p_value']:.3f})")
    write_results(cfg, "keep_one", result, task, split, inputs={"selection_split": selection}, figures=[figure])
    log_run(cfg, "keep_one", result, {"keep_one": keep_one_rows(result)}, [figure])
    return {"objective": result["base_score"], **result}
