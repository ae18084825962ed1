"""The speed measurement says when a gain is noise: paired interval, verdict, adaptive repeats, a busy CPU."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import pytest
import torch
from conftest import tiny_bert

from headprune.engine.timing import compare_throughput
from headprune.engine.verdict import gain_summary, gain_text, verdict


def test_gain_is_the_ratio_of_mean_times():
    """The gain agrees in sign with the two throughputs (examples / mean time), even where the mean per-repeat gain does not."""
    original, pruned = [1.0, 10.0], [0.5, 12.0]  # per-repeat gains +100% and -17%: their mean is +42%
    summary = gain_summary(original, pruned)
    assert summary["gain"] == pytest.approx(11.0 / 12.5 - 1)  # mean original time / mean pruned time - 1 = -12%
    assert (summary["gain"] < 0) == (1 / sum(pruned) < 1 / sum(original))  # the pruned model's throughput is the lower
    low, high = summary["gain_interval"]
    assert low <= summary["gain"] <= high


def test_interval_matches_a_paired_bootstrap():
    """The delta-method 95% interval of the ratio of mean times agrees with a paired bootstrap of it (400 repeats)."""
    import numpy as np

    rng = np.random.default_rng(0)
    load = rng.gamma(4.0, 0.05, 400)  # background load hits both models of a repeat alike
    original = 1.0 + load + rng.normal(0, 0.03, 400)
    pruned = 0.8 + 0.8 * load + rng.normal(0, 0.03, 400)
    summary = gain_summary(original.tolist(), pruned.tolist())
    draws = rng.integers(0, 400, (4000, 400))  # resample repeats (pairs kept together)
    ratios = original[draws].mean(1) / pruned[draws].mean(1) - 1
    low, high = np.percentile(ratios, [2.5, 97.5])
    half = (summary["gain_interval"][1] - summary["gain_interval"][0]) / 2
    assert half == pytest.approx((high - low) / 2, rel=0.1)
    assert summary["gain"] == pytest.approx(original.mean() / pruned.mean() - 1)
    assert summary["gain_interval"][0] == pytest.approx(low, abs=0.2 * half)
    assert summary["repeats"] == 400 and verdict(summary) == "confident"


@pytest.mark.parametrize(
    "original,pruned,expected",
    [
        ([1.0, 1.0, 1.0, 1.0], [0.8, 0.81, 0.79, 0.8], "confident"),  # a steady 25% gain
        ([1.0, 0.5, 1.5, 1.0], [0.7, 1.0, 0.9, 1.3], "inconclusive"),  # interval includes zero
        ([1.0, 1.0, 1.0, 1.0, 1.0, 1.0] * 20, [0.6, 1.5, 0.6, 1.5, 0.6, 0.9] * 20, "inconclusive"),  # spread > gain
        ([1.0], [0.5], "inconclusive"),  # one repeat: no interval
    ],
)
def test_verdict(original, pruned, expected):
    summary = gain_summary(original, pruned)
    assert verdict(summary) == expected
    row = {**summary, "verdict": verdict(summary)}
    assert gain_text(row).startswith("inconclusive") == (expected == "inconclusive")


def _models_and_batches():
    from headprune.core.pruning import prune_mask

    torch.manual_seed(0)
    original = tiny_bert(layers=4, heads=8)
    pruned = copy.deepcopy(original)
    mask = torch.ones(4, 8)
    mask[:, :6] = 0  # 6 of 8 heads gone in every layer
    prune_mask(pruned, {"enc_self": mask})
    gen = torch.Generator().manual_seed(0)
    batches = [
        {"input_ids": torch.randint(3, 100, (16, 48), generator=gen), "attention_mask": torch.ones(16, 48, dtype=torch.long)}
        for _ in range(2)
    ]
    return {name: (lambda batch, m=m: m(**batch)) for name, m in (("original", original), ("pruned", pruned))}, batches


def test_adaptive_repeats_stop_when_tight_or_at_the_cap():
    models, batches = _models_and_batches()
    loose = compare_throughput(models, batches[:1], warmup=1, repeats=3, max_seconds=30, tolerance=10.0, max_repeats=50)
    assert len(loose["original"]["seconds"]) == 3  # tight at once: the minimum only
    strict = compare_throughput(models, batches[:1], warmup=1, repeats=3, max_seconds=30, tolerance=1e-9, max_repeats=8)
    assert len(strict["original"]["seconds"]) == len(strict["pruned"]["seconds"]) == 8


def test_tables_show_inconclusive_instead_of_a_number():
    """The docs table, the run's table and the figure say "inconclusive" where the verdict does; old rows keep numbers."""
    from docs_tables import speed_table as docs_speed_table

    from headprune.viz.plots import speed_bars
    from headprune.viz.tables import speed_rows as speed_table

    timing = {"examples_per_s": 10.0, "spread": 1.0}
    noisy = {
        "batch_size": 1,
        "original": timing,
        "pruned": timing,
        "flop_ideal_gain": 0.2,
        "gain_vs_ideal": 0.5,
        **gain_summary([1.0, 0.5, 1.5, 1.0], [0.7, 1.0, 0.9, 1.3]),
    }
    noisy["verdict"] = verdict(noisy)
    old = {"batch_size": 4, "original": timing, "pruned": timing, "gain": 0.123, "flop_ideal_gain": 0.2, "gain_vs_ideal": 0.6}
    cost = {"parameters": 1, "attention_flops": 1}
    result = {
        "rows": [noisy, old],
        "cost": {"original": cost, "pruned": cost},
        "units_removed": 1,
        "units_total": 2,
        "device": "cpu",
        "score_check": {"equal": True, "metric": "accuracy", "masked": 1.0, "pruned": 1.0},
    }
    columns, rows = speed_table(result)
    assert rows[0][columns.index("gain")] is None and rows[0][columns.index("verdict")] == "inconclusive"
    assert rows[1][columns.index("gain")] == 0.123
    text = docs_speed_table({"results": result})
    assert "| inconclusive |" in text and "+12.3%" in text
    assert speed_bars(result["rows"], Path(tempfile.mkdtemp()) / "speed.png", "t").stat().st_size > 1000
