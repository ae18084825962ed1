"""The same command twice gives the same model and the same results.json (timestamps and paths aside)."""

from __future__ import annotations

import json

import pytest
import torch
from experiment_helpers import make_cfg

VOLATILE = {"created", "timestamp", "started", "finished", "elapsed_s", "seconds", "output_dir", "run_dir", "load_average"}


def _stable(value):
    """The results with the keys that name a time or a place left out."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


@pytest.mark.parametrize("task", ["nli", "mt", "lm"])
def test_a_fresh_model_is_seeded_from_the_config(tmp_path, task):
    from headprune.results.writer import model_fingerprint
    from headprune.tasks.registry import load_task

    prints = []
    for run in ("a", "b"):
        torch.manual_seed(len(run) * 1000 + ord(run))  # the caller's random state must not matter
        prints.append(model_fingerprint(load_task(make_cfg(tmp_path / run, "prune", task)).model))
    assert prints[0] == prints[1]
    other = load_task(make_cfg(tmp_path / "c", "prune", task, "seed=1")).model
    assert model_fingerprint(other) != prints[0]


def test_the_same_prune_command_twice_gives_the_same_results(tmp_path):
    from headprune.experiments.prune import run

    results = []
    for name in ("first", "second"):
        torch.manual_seed(ord(name[0]))
        cfg = make_cfg(tmp_path / name, "prune", "nli", "prune.order=[fisher,random]", "prune.step=0.25")
        run(cfg)
        results.append(json.loads((tmp_path / name / "results.json").read_text()))
    for result in results:
        result["config"].pop("paths")  # where the run wrote: the only setting that differs
    first, second = _stable(results[0]), _stable(results[1])
    assert {k for k in first if first[k] != second.get(k)} == set()
    assert first["fingerprints"]["model"] == second["fingerprints"]["model"]
