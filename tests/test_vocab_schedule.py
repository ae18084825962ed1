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


def test_every_round_of_a_vocabulary_schedule_recovers_on_the_text_it_ships_with(capsys, monkeypatch, tmp_path):
    import torch

    from headprune.export.renumbering import renumbering
    from headprune.stages import prune_speed

    calls = []

    def recorded(recovery, unit, settings, logger, progress, out, call):
        model, _, batches, tuning, _ = call
        kept = torch.tensor(renumbering(model, model_tokenizer[0]).kept)
        calls.append([torch.isin(torch.cat([b["input_ids"].flatten() for b in part]), kept).all() for part in (batches, tuning)])
        return real(recovery, unit, settings, logger, progress, out, call)

    real, model_tokenizer = prune_speed.run_recovery, []
    load = prune_speed.pareto_run

    def pareto_run(task, *args):
        model_tokenizer.append(task.tokenizer)
        return load(task, *args)

    monkeypatch.setattr(prune_speed, "run_recovery", recorded)
    monkeypatch.setattr(prune_speed, "pareto_run", pareto_run)
    overrides = [*TINY_LM_PRUNE, "data.tokenizer.vocab_size=400", "prune.unit=vocab", "prune.cost=bytes"]
    finetune = ["prune.recover=finetune", "prune.finetune.examples=8", "prune.finetune.max_steps=1"]
    status, err = headprune(
        capsys, monkeypatch, tmp_path, tmp_path / "run", *overrides, *finetune, "prune.schedule=[{bytes:0.98},{bytes:0.965}]"
    )
    assert status == 0, err
    assert len(calls) == 2 and all(bool(ok) for call in calls for ok in call)  # calibration and fine-tune text: kept tokens only
