"""A schedule of vocabulary cuts keeps the kind's floor in every round, as one shot does: a round that removed a special
token left the rewritten tokenizer's post-processor naming an id that no longer exists (a KeyError)."""

from __future__ import annotations

import json

from cli_runs import TINY_LM_PRUNE, headprune


def test_a_vocabulary_schedule_runs_every_round(capsys, monkeypatch, tmp_path):
    overrides = [*TINY_LM_PRUNE, "data.tokenizer.vocab_size=400", "prune.unit=vocab", "prune.cost=bytes", "prune.recover=none"]
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "run", *overrides, "prune.schedule=[{bytes:0.98},{bytes:0.965}]")
    assert status == 0, err
    points = [p for p in json.loads((tmp_path / "run" / "results.json").read_text())["results"]["points"] if p["order"] != "unpruned"]
    assert len(points) == 2 and all(p["units_by_kind"]["vocab"]["removed"] > 0 for p in points)
