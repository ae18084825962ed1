"""A resumed study reuses a stage only when its settings and inputs are unchanged; damaged stage files are recomputed."""

from __future__ import annotations

import json

from experiment_helpers import make_cfg, task_fixtures

from headprune.experiments import study
from headprune.stages import saved_stages as stages

task, shared_task = task_fixtures("nli")

SMALL = [
    "study.train=false",
    "study.n_samples=20",
    "study.extra_splits=[]",
    "prune.step=0.5",
    "speed.batch_sizes=[2]",
    "speed.examples=4",
    "speed.warmup=0",
    "speed.repeats=1",
    "speed.max_repeats=2",
    "speed.max_seconds=1",
]
RUN_STAGES = ("scores", "ablate", "keep_one", "prune", "speed")  # the stages of a study with study.train=false


# ---- the stage helper ---------------------------------------------------------------------------


def test_stage_reuses_same_key_and_recomputes_changed_or_damaged(tmp_path, capsys):
    calls = []

    def compute():
        calls.append(1)
        return {"value": len(calls)}

    key = {"settings": {"importance": {"reduce": "example"}}, "inputs": {}}
    assert stages.stage(tmp_path, "scores", key, compute) == {"value": 1}
    assert stages.stage(tmp_path, "scores", key, compute) == {"value": 1} and len(calls) == 1
    assert "scores: complete in" in capsys.readouterr().out
    changed = {"settings": {"importance": {"reduce": "token"}}, "inputs": {}}
    assert stages.stage(tmp_path, "scores", changed, compute) == {"value": 2}
    assert 'scores: changed since scores.json (importance.reduce: "example" -> "token"): recomputing' in capsys.readouterr().out
    (tmp_path / "stages" / "scores.json").write_text('{"complete": tr')
    assert stages.stage(tmp_path, "scores", changed, compute) == {"value": 3}
    assert f"scores: {tmp_path / 'stages' / 'scores.json'} is not valid JSON" in capsys.readouterr().out
    record = json.loads((tmp_path / "stages" / "scores.json").read_text())
    assert record["key"] == changed and record["fingerprint"] == stages.digest(changed) and record["complete"]


def test_changed_settings_names_each_setting_and_hides_digests():
    old = {"settings": {"task": {"lr": 1e-4}, "data": {"limit_train": 8000}}, "inputs": {"prune": "0123456789abcdef"}}
    new = {"settings": {"task": {"lr": 3e-5}, "data": {"limit_train": 300}}, "inputs": {"prune": "fedcba9876543210"}}
    assert stages.changed_settings(old, new) == "task.lr: 0.0001 -> 3e-05, data.limit_train: 8000 -> 300, input prune changed"
    new["settings"]["seed"] = 1
    assert stages.changed_settings(old, new).endswith("seed: null -> 1 and 1 more")


def test_training_settings_are_the_training_config_with_overrides(tmp_path):
    from headprune.experiments.study import study_training_config

    cfg = make_cfg(tmp_path, "study", "nli", "study.train_overrides={task.lr:3e-5}", "data.limit_train=300")
    settings = stages.training_settings(study_training_config(cfg))
    assert settings["task"]["lr"] == 3e-5 and settings["data"]["limit_train"] == 300 and settings["seed"] == cfg.seed
    assert {"model", "trainer"} <= set(settings) and not {"paths", "logger", "study", "prune", "speed", "importance"} & set(settings)
    assert "enable_progress_bar" not in settings["trainer"]  # display only: no retraining for a progress bar


def test_damaged_training_results_are_named(tmp_path):
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    assert study.missing_training_output(tmp_path) == f"{tmp_path / 'results.json'} is missing"
    (tmp_path / "results.json").write_text("{")
    assert "results.json is not valid JSON" in study.missing_training_output(tmp_path)
    (tmp_path / "results.json").write_text("{}")
    assert study.missing_training_output(tmp_path) is None


# ---- the training stage -------------------------------------------------------------------------


def test_changed_training_setting_retrains(tmp_path, capsys):
    train = [
        "study.train_overrides={task.lr:1e-4}",
        "data.limit_train=32",
        "trainer.enable_progress_bar=false",
        "+trainer.enable_model_summary=false",
    ]
    cfg = make_cfg(tmp_path, "study", "nli", *train)
    study.train_stage(cfg, tmp_path)
    record = tmp_path / "stages" / "train.json"
    first = record.stat().st_mtime_ns
    assert json.loads(record.read_text())["key"]["settings"]["task"]["lr"] == 1e-4
    assert cfg.model.pretrained == str(tmp_path / "train" / "model")
    study.train_stage(make_cfg(tmp_path, "study", "nli", *train), tmp_path)
    assert record.stat().st_mtime_ns == first and "train: complete in" in capsys.readouterr().out
    study.train_stage(make_cfg(tmp_path, "study", "nli", *train, "study.train_overrides={task.lr:3e-5}"), tmp_path)
    assert "train: changed since train.json (task.lr: 0.0001 -> 3e-05): recomputing" in capsys.readouterr().out
    assert json.loads(record.read_text())["key"]["settings"]["task"]["lr"] == 3e-5
    saved = json.loads((tmp_path / "train" / "results.json").read_text())
    assert saved["config"]["task"]["lr"] == 3e-5  # the model on disk is the retrained one
    (tmp_path / "train" / "results.json").write_text("{")  # damaged: named, and the model retrained
    study.train_stage(make_cfg(tmp_path, "study", "nli", *train, "study.train_overrides={task.lr:3e-5}"), tmp_path)
    assert "results.json is not valid JSON (damaged: an interrupted write?): retraining" in capsys.readouterr().out
    assert json.loads((tmp_path / "train" / "results.json").read_text())["config"]["task"]["lr"] == 3e-5


# ---- the whole study (untrained tiny model) -----------------------------------------------------


def stamps(out) -> dict:
    return {name: (out / "stages" / f"{name}.json").stat().st_mtime_ns for name in RUN_STAGES}


def test_study_resume_recomputes_exactly_the_stages_whose_inputs_changed(shared_task, tmp_path, capsys):
    study.run(make_cfg(tmp_path, "study", "nli", *SMALL))
    first = stamps(tmp_path)
    capsys.readouterr()

    study.run(make_cfg(tmp_path, "study", "nli", *SMALL))  # nothing changed: every stage skipped
    assert stamps(tmp_path) == first
    out = capsys.readouterr().out
    assert all(f"[study] {name}: complete in" in out for name in RUN_STAGES) and "recomputing" not in out

    study.run(make_cfg(tmp_path, "study", "nli", *SMALL, "importance.reduce=token"))
    again = stamps(tmp_path)
    assert {name for name in RUN_STAGES if again[name] != first[name]} == {"scores", "prune", "speed"}
    out = capsys.readouterr().out
    assert 'scores: changed since scores.json (importance.reduce: "example" -> "token"): recomputing' in out
    assert "speed: changed since speed.json (input prune changed" in out
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["config"]["importance"]["reduce"] == "token"
    saved = json.loads((tmp_path / "stages" / "scores.json").read_text())
    assert payload["results"]["scores"] == saved["results"]
    assert payload["inputs"]["stage_fingerprints"]["scores"] == saved["fingerprint"]  # results.json says which settings

    (tmp_path / "stages" / "prune.json").write_text('{"schema_version": 1, "stage": "pr')  # an interrupted write
    study.run(make_cfg(tmp_path, "study", "nli", *SMALL, "importance.reduce=token"))
    out = capsys.readouterr().out
    assert f"[study] prune: {tmp_path / 'stages' / 'prune.json'} is not valid JSON" in out and "recomputing" in out
    record = json.loads((tmp_path / "stages" / "prune.json").read_text())
    assert record["complete"] and record["results"]["orders"]["importance"]["steps"]
    final = stamps(tmp_path)
    assert all(final[name] == again[name] for name in ("scores", "ablate", "keep_one"))


def test_atomic_results_get_the_mode_of_a_plain_write(tmp_path):
    import os

    from headprune.results.writer import write_json_atomic

    (tmp_path / "plain.json").write_text("{}")
    write_json_atomic(tmp_path / "atomic.json", {})
    assert os.stat(tmp_path / "atomic.json").st_mode == os.stat(tmp_path / "plain.json").st_mode
    assert not list(tmp_path.glob(".*.tmp"))
