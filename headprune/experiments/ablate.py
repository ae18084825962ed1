"""experiment=ablate: remove each head alone; score difference to the unmasked model, with significance.

Paper section 3.2 (Table 1, Figure 1); with two splits also section 3.4 (Pearson r of the per-head
differences across the two evaluation sets).
"""

from __future__ import annotations

from dataclasses import asdict

import torch

from headprune.engine.ablation import single_head_masks
from headprune.experiments.evaluation import check_split, evaluate_many, unit_counts
from headprune.lightning.loggers import log_run
from headprune.results.run_dir import tensor_dict, write_results
from headprune.results.writer import output_dir
from headprune.scoring.significance import correlation
from headprune.selection.greedy import check_groups
from headprune.tasks import registry
from headprune.viz.plots import head_heatmaps
from headprune.viz.tables import ablation_rows


def ablation_stage(task, split: str, groups, n_samples: int, seed: int, alpha: float, *, progress: bool, base=None) -> dict:
    """Single-head ablation of every head of ``groups`` on ``split``: deltas, p-values, significance, rows.

    ``alpha`` None: the task's own significance level (the oracle pruning order reads only the deltas).
    """
    shape = task.gates.groups
    groups = check_groups(groups, shape)
    masks, heads = single_head_masks(shape, groups)
    base = base or task.evaluate(None, split=split)
    results = evaluate_many(task, masks, split, desc=f"ablate {split}", progress=progress)
    tests = task.paired_test(base, results, n_samples=n_samples, seed=seed, **({} if alpha is None else {"alpha": alpha}))
    delta = {g: torch.full(shape[g], float("nan")) for g in groups}
    p_value = {g: torch.full(shape[g], float("nan")) for g in groups}
    significant = {g: torch.zeros(shape[g], dtype=torch.bool) for g in groups}
    rows = []
    for (group, layer, head), res, test in zip(heads, results, tests):
        delta[group][layer, head] = test.delta
        p_value[group][layer, head] = test.p_value
        significant[group][layer, head] = test.significant
        rows.append({"group": group, "layer": layer, "head": head, "score": res.score, **asdict(test)})
    per_group = {}
    for group in groups:
        sig = significant[group]
        d = delta[group]
        per_group[group] = {
            "heads": int(d.numel()),
            "significant": int(sig.sum()),
            "significant_better": int((sig & (d > 0)).sum()),
            "significant_worse": int((sig & (d < 0)).sum()),
            "max_drop": float(-d.min()),
            "max_gain": float(d.max()),
        }
    return {
        "metric": task.metric,
        "split": split,
        "n_examples": base.n,
        "base_score": base.score,
        **unit_counts(task.gates, groups),
        "bootstrap": {"n_samples": n_samples, "seed": seed, "alpha": alpha, "test": task.paired_test_name},
        "per_group": per_group,
        "delta": tensor_dict(delta),
        "p_value": tensor_dict(p_value),
        "significant": {g: s.int().tolist() for g, s in significant.items()},
        "rows": rows,
    }


def ablation_figure(result: dict, path, title: str):
    return head_heatmaps(result["delta"], result["significant"], path, title, f"{result['metric']} difference")


def run(cfg) -> dict:
    """Ablate every head alone on each split of ``ablate.splits``; write results.json, heatmaps, W&B."""
    settings = cfg.ablate
    task = registry.load_task(cfg)
    splits = list(settings.splits)
    if not splits:
        raise ValueError("ablate.splits is empty: give at least one evaluation split (e.g. [eval])")
    for split in splits:
        check_split(task, split)
    groups = check_groups(settings.groups, task.gates.groups)
    out = output_dir(cfg)
    numbers, figures, tables = {"splits": {}}, [], {}
    for split in splits:
        result = ablation_stage(task, split, groups, int(settings.n_samples), int(cfg.seed), float(settings.alpha), progress=True)
        numbers["splits"][split] = result
        figures.append(ablation_figure(result, out / f"ablate_{split}.png", f"Single-head ablation on {split} ({cfg.model.name})"))
        tables[f"ablate_{split}"] = ablation_rows(result)
        print(
            f"{split}: base {result['metric']} {result['base_score']:.2f}; significant heads per group: "
            + ", ".join(f"{g}={v['significant']}/{v['heads']}" for g, v in result["per_group"].items())
        )
    if len(splits) > 1:
        numbers["correlation"] = correlation(numbers["splits"][splits[0]], numbers["splits"][splits[1]])
    write_results(cfg, "ablate", numbers, task, splits[0], figures=figures)
    log_run(cfg, "ablate", numbers, tables, figures)
    return {"objective": numbers["splits"][splits[0]]["base_score"], **numbers}


READS = ("ablate", "prune.unit")  # the settings groups (and keys) experiment=ablate reads


def check(cfg) -> None:
    """experiment=ablate: the model and task, the unit, and ablate.* (splits known and listed once)."""
    from headprune.core.checks import ConfigError
    from headprune.experiments.shared_checks import check_model_and_task, check_reads, check_splits, check_unit, no_duplicates

    check_model_and_task(cfg, reads_importance=False)
    check_reads(cfg, READS)
    check_unit(cfg)
    splits = cfg.ablate.splits
    if not splits:
        raise ConfigError("ablate.splits is empty: give at least one evaluation split (e.g. [eval])")
    no_duplicates(splits, "ablate.splits")
    no_duplicates(cfg.ablate.groups, "ablate.groups")
    check_splits(cfg, splits, "ablate.splits")
