"""The experiments on the passkey task (tiny random Llama, synthetic haystack): a real, moving score in both units."""

from __future__ import annotations

import pytest
from experiment_helpers import make_cfg, results, task_fixtures

TASK = "passkey"

task, shared_task = task_fixtures(TASK)


def run(tmp_path, experiment: str, *overrides) -> dict:
    """Validate and run ``headprune experiment=<experiment>`` on the tiny passkey config; its results.json payload."""
    from hydra.utils import get_method

    from headprune.validation import validate

    cfg = make_cfg(tmp_path, experiment, TASK, *overrides)
    validate(cfg)
    get_method(cfg.run)(cfg)
    return results(tmp_path)


@pytest.mark.parametrize("unit", ["head", "kv_group"])
def test_prune_scores_key_log_likelihood(tmp_path, shared_task, unit):
    payload = run(tmp_path, "prune", f"prune.unit={unit}", "prune.order=[importance,random]", "prune.step=0.25")
    assert payload["inputs"]["task"] == "passkey"
    steps = payload["results"]["orders"]["importance"]["steps"]
    scores = [s["score"] for s in steps]
    assert len(set(round(s, 6) for s in scores)) > 1  # removing heads moves the score of a random model


def test_ablate_runs_the_paired_bootstrap(tmp_path, shared_task):
    payload = run(tmp_path, "ablate", "prune.unit=kv_group")
    assert payload["experiment"] == "ablate" and "dec_self" in str(payload["results"])
