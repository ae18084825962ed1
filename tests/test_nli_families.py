"""NLI on DistilBERT and DeBERTa-v2 (tiny random models, synthetic NLI): ablation, pruning and the pruned model's speed check."""

from __future__ import annotations

import pytest
from experiment_helpers import FAST, NLI, compose_cfg, results

from headprune.experiments import ablate, prune, speed


def _cfg(tmp_path, model: str, experiment: str, *overrides):
    base = [f"model={model}" if o.startswith("model=") else o for o in NLI]
    extra = [o for o in FAST if o.split("=")[0].split(".")[0] in ("logger", experiment)]
    return compose_cfg(tmp_path, [f"experiment={experiment}", *base, "device=cpu", *extra, *overrides])


@pytest.mark.parametrize("model", ["tiny_distilbert", "tiny_deberta_v2"])
def test_nli_ablate_prune_and_speed(model, tmp_path):
    ablate.run(_cfg(tmp_path / "a", model, "ablate"))
    rows = results(tmp_path / "a")["results"]["splits"]["eval"]["rows"]
    assert len(rows) == 2 * 4  # 2 layers x 4 heads
    prune.run(_cfg(tmp_path / "p", model, "prune", "prune.fractions=[0.5]"))
    speed_overrides = ["speed.batch_sizes=[2]", "speed.examples=4", "speed.repeats=2", "speed.warmup=1"]
    speed.run(_cfg(tmp_path / "s", model, "speed", f"speed.mask_file={tmp_path / 'p' / 'results.json'}", *speed_overrides))
    res = results(tmp_path / "s")["results"]
    assert res["score_check"]["equal"] and res["heads_pruned"] == 4


def test_min_heads_check_reads_distilbert_head_count(tmp_path):
    from headprune.core.checks import ConfigError
    from headprune.validation import validate

    with pytest.raises(ConfigError, match="at most 3"):
        validate(_cfg(tmp_path, "tiny_distilbert", "prune", "prune.min_heads_per_layer=4"))  # n_heads: 4
