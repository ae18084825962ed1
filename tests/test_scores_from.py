"""prune.scores_from: the orders of an earlier run rank the units of a new one, at another context length, without
scoring again; the new run's masks are the earlier scores' masks, and scores of another model are refused before work."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runs import TINY_LM_PRUNE, headprune

import headprune.sources.orders as orders_module
from headprune.results.run_dir import mask_from_json
from headprune.selection.uniform import layout_masks

SMALL = [
    *TINY_LM_PRUNE,
    "prune.action=stream",
    "prune.unit=kv_group",
    "prune.stream.window=8",
    "prune.order=[importance,random]",
    "prune.fractions=[0,0.25,0.5,0.75]",
]


def _run(capsys, monkeypatch, tmp_path, name: str, *overrides: str) -> dict:
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / name, *SMALL, *overrides)
    assert status == 0, err
    return json.loads((tmp_path / name / "results.json").read_text())["results"]


def test_scores_from_an_earlier_run_give_its_masks_at_another_length(capsys, monkeypatch, tmp_path):
    scored = _run(capsys, monkeypatch, tmp_path, "scored")

    def not_again(*args, **kwargs):
        raise AssertionError("the importance order was scored again")

    monkeypatch.setattr(orders_module, "importance_scores", not_again)
    reused = _run(capsys, monkeypatch, tmp_path, "reused", "data.max_length=32", f"prune.scores_from={tmp_path}/scored/results.json")
    assert reused["stream"]["context_tokens"] == 32 and scored["stream"]["context_tokens"] == 48
    for order in ("importance", "random"):
        assert reused["orders"][order]["head_scores"] == scored["orders"][order]["head_scores"]
        scores = {g: torch.tensor(v) for g, v in scored["orders"][order]["head_scores"].items()}
        expected = layout_masks(scores, {"dec_self": (2, 2)}, [0, 0.25, 0.5, 0.75])
        for step, mask, before in zip(reused["orders"][order]["steps"], expected, scored["orders"][order]["steps"]):
            assert torch.equal(mask_from_json(step["mask"])["dec_self"], mask["dec_self"]), (order, step["fraction"])
            assert step["mask"] == before["mask"]


def test_scores_of_another_model_are_refused_before_evaluation(capsys, monkeypatch, tmp_path):
    scores = {"dec_self": [[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]]}  # three KV groups per layer: tiny_llama has two
    results = {"action": "stream", "unit": "kv_group", "orders": {"importance": {"steps": [], "head_scores": scores}}}
    (tmp_path / "other.json").write_text(json.dumps({"results": results}))
    evaluated = []
    monkeypatch.setattr("headprune.stages.greedy_stage.evaluate_one", lambda *a, **k: evaluated.append(1))
    status, err = headprune(
        capsys, monkeypatch, tmp_path, tmp_path / "run", *SMALL, "prune.order=importance", f"prune.scores_from={tmp_path}/other.json"
    )
    assert status == 2 and not evaluated
    assert "its importance scores have the shapes {'dec_self': (2, 3)}, and this model's units {'dec_self': (2, 2)}" in err


def test_retrieval_scores_from_a_passkey_run_rank_a_task_without_needles(tmp_path):
    """The retrieval order needs needles to be computed, not to be read: its passkey scores rank long documents."""
    from experiment_helpers import LM, compose_cfg

    from headprune.core.checks import ConfigError
    from headprune.validation import validate

    scores = {"dec_self": [[0.1, 0.2], [0.3, 0.4]]}
    results = {"action": "stream", "unit": "kv_group", "orders": {"retrieval": {"steps": [], "head_scores": scores}}}
    (tmp_path / "passkey.json").write_text(json.dumps({"results": results}))
    stream = ["experiment=prune", "prune.action=stream", "prune.unit=kv_group", "prune.stream.window=8", "prune.order=retrieval"]
    validate(compose_cfg(tmp_path, [*LM, *stream, f"prune.scores_from={tmp_path}/passkey.json", "logger=none"]))
    with pytest.raises(ConfigError, match="has no needles"):
        validate(compose_cfg(tmp_path, [*LM, *stream, "logger=none"]))
