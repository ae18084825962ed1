"""The study's oracle (ablation) pruning order reads prune.ablation_split, not always the evaluation split."""

from __future__ import annotations

import json

import pytest
import torch
from experiment_helpers import make_cfg, task_fixtures

from headprune.experiments import study
from headprune.stages import study_stages

task, shared_task = task_fixtures("nli")


class Captured(Exception):
    """Raised by the stand-in prune stage: what the study passed is all this test needs."""


@pytest.mark.parametrize("ablation_split", ["eval_mismatched", "importance"])
def test_study_prunes_by_the_ablation_split(tmp_path, shared_task, monkeypatch, ablation_split):
    seen = {}

    def prune_stage(task, prune, orders, fractions, settings, split, shared, *args, **kwargs):
        seen.update(split=split, ablation_split=settings.ablation_split, deltas=shared.get("ablation_deltas"))
        raise Captured

    monkeypatch.setattr(study_stages, "prune_stage", prune_stage)
    cfg = make_cfg(tmp_path, "study", "nli", "study.train=false", "study.n_samples=20", f"prune.ablation_split={ablation_split}")
    with pytest.raises(Captured):
        study.run(cfg)
    assert seen["split"] == "eval" and seen["ablation_split"] == ablation_split
    saved = json.loads((tmp_path / "stages" / "ablate.json").read_text())["results"]["splits"]
    if ablation_split in saved:  # ablated by the study already: its differences are reused
        for group, delta in saved[ablation_split]["delta"].items():
            assert torch.allclose(seen["deltas"][group], torch.tensor(delta))
    else:  # not ablated yet: the prune stage ablates that split itself, never the evaluation split's differences
        assert seen["deltas"] is None
