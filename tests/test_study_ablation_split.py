"""The study's oracle (ablation) pruning order reads prune.ablation_split, not always the evaluation split."""
from __future__ import annotations

import json

import pytest
import torch

from experiment_helpers import make_cfg, task_fixtures
from headprune.experiments import study

task, shared_task = task_fixtures("nli")


class Captured(Exception):
    """Raised by the stand-in prune stage: what the study passed is all this test needs."""


def test_study_prunes_by_the_ablation_split(tmp_path, shared_task, monkeypatch):
    seen = {}

    def prune_stage(task, orders, fractions, groups, min_per_layer, reestimate, icfg, split, seed, shared, ablation_split, n_samples,
                    **kwargs):
        seen.update(split=split, ablation_split=ablation_split, deltas=shared.get("ablation_deltas"))
        raise Captured

    monkeypatch.setattr(study, "prune_stage", prune_stage)
    cfg = make_cfg(tmp_path, "study", "nli", "study.train=false", "study.n_samples=20", "prune.ablation_split=eval_mismatched")
    with pytest.raises(Captured):
        study.run(cfg)
    assert seen["split"] == "eval" and seen["ablation_split"] == "eval_mismatched"
    saved = json.loads((tmp_path / "stages" / "ablate.json").read_text())["results"]["splits"]
    assert saved["eval"]["delta"] != saved["eval_mismatched"]["delta"]  # the two splits give different oracles
    for group, delta in saved["eval_mismatched"]["delta"].items():
        assert torch.allclose(seen["deltas"][group], torch.tensor(delta))
