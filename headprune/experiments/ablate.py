"""experiment=ablate: remove each head alone; score difference to the unmasked model, with significance.

Paper section 3.2 (Table 1, Figure 1); with two splits also section 3.4 (Pearson r of the per-head
differences across the two evaluation sets).
"""
from __future__ import annotations

import numpy as np
import torch

from headprune.ablation import single_head_masks
from headprune.experiments import common
from headprune.ordering import check_groups
from headprune.plots import head_heatmaps
from headprune.significance import paired_test


def ablation_stage(task, split: str = "eval", groups=None, n_samples: int = 1000, seed: int = 0, alpha: float = 0.01,
                   progress: bool = True, base=None) -> dict:
    """Single-head ablation of every head of ``groups`` on ``split``: deltas, p-values, significance, rows."""
    shape = task.gates.groups
    groups = check_groups(groups, shape)
    masks, heads = single_head_masks(shape, groups)
    base = base or task.evaluate(None, split=split)
    results = common.evaluate_many(task, masks, split, desc=f"ablate {split}", progress=progress)
    tests = paired_test(task.metric, base, results, n_samples=n_samples, seed=seed, alpha=alpha)
    delta = {g: torch.full(shape[g], float("nan")) for g in groups}
    p_value = {g: torch.full(shape[g], float("nan")) for g in groups}
    significant = {g: torch.zeros(shape[g], dtype=torch.bool) for g in groups}
    rows = []
    for (group, layer, head), res, test in zip(heads, results, tests):
        delta[group][layer, head] = test.delta
        p_value[group][layer, head] = test.p_value
        significant[group][layer, head] = test.significant
        rows.append({"group": group, "layer": layer, "head": head, "score": res.score, **test.as_dict()})
    per_group = {}
    for group in groups:
        sig = significant[group]
        d = delta[group]
        per_group[group] = {"heads": int(d.numel()), "significant": int(sig.sum()),
                            "significant_better": int((sig & (d > 0)).sum()), "significant_worse": int((sig & (d < 0)).sum()),
                            "max_drop": float(-d.min()), "max_gain": float(d.max())}
    return {
        "metric": task.metric, "split": split, "n_examples": base.n, "base_score": base.score,
        "bootstrap": {"n_samples": n_samples, "seed": seed, "alpha": alpha,
                      "test": "sacrebleu PairedTest(bs)" if task.metric == "bleu" else "paired bootstrap (Koehn 2004)"},
        "per_group": per_group,
        "delta": common.tensor_dict(delta), "p_value": common.tensor_dict(p_value),
        "significant": {g: s.int().tolist() for g, s in significant.items()},
        "rows": rows,
    }


def correlation(first: dict, second: dict) -> dict:
    """Pearson r between the per-head differences of two ablation results (paper section 3.4)."""
    a = np.concatenate([np.asarray(first["delta"][g], dtype=float).ravel() for g in first["delta"]])
    b = np.concatenate([np.asarray(second["delta"][g], dtype=float).ravel() for g in first["delta"]])
    if a.std() == 0 or b.std() == 0:
        return {"pearson_r": float("nan"), "p_value": float("nan"), "splits": [first["split"], second["split"]]}
    from scipy.stats import pearsonr

    r, p = pearsonr(a, b)
    return {"pearson_r": float(r), "p_value": float(p), "splits": [first["split"], second["split"]]}


def ablation_table(result: dict) -> tuple[list[str], list[list]]:
    columns = ["group", "layer", "head", "score", "delta", "p_value", "significant"]
    return columns, [[r["group"], r["layer"] + 1, r["head"] + 1, r["score"], r["delta"], r["p_value"], r["significant"]] for r in result["rows"]]


def ablation_figure(result: dict, path, title: str):
    label = f"{result['metric']} difference ({'BLEU' if result['metric'] == 'bleu' else 'accuracy points'})"
    return head_heatmaps(result["delta"], result["significant"], path, title, label)


def run(cfg) -> dict:
    """Ablate every head alone on each split of ``ablate.splits``; write results.json, heatmaps, W&B."""
    settings = cfg.ablate
    task = common.load_task(cfg)
    splits = list(settings.splits)
    if not splits:
        raise ValueError("ablate.splits is empty: give at least one evaluation split (e.g. [eval])")
    for split in splits:
        common.check_split(task, split)
    groups = check_groups(settings.get("groups"), task.gates.groups)
    out = common.output_dir(cfg)
    numbers, figures, tables = {"splits": {}}, [], {}
    for split in splits:
        result = ablation_stage(task, split, groups, int(settings.n_samples), int(cfg.seed), float(settings.alpha))
        numbers["splits"][split] = result
        figures.append(ablation_figure(result, out / f"ablate_{split}.png", f"Single-head ablation on {split} ({cfg.model.name})"))
        tables[f"ablate_{split}"] = ablation_table(result)
        print(f"{split}: base {result['metric']} {result['base_score']:.2f}; significant heads per group: "
              + ", ".join(f"{g}={v['significant']}/{v['heads']}" for g, v in result["per_group"].items()))
    if len(splits) > 1:
        numbers["correlation"] = correlation(numbers["splits"][splits[0]], numbers["splits"][splits[1]])
    common.write_results(cfg, "ablate", numbers, task, splits[0], figures=figures)
    common.log_run(cfg, "ablate", numbers, tables, figures)
    return {"objective": numbers["splits"][splits[0]]["base_score"], **numbers}
