"""A machine too slow to time within speed.max_seconds: the study records the speed stage as not timed and exits 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from experiment_helpers import NLI, ROOT, make_cfg, results, speed_settings, task_fixtures

from headprune.engine.verdict import NOT_TIMED
from headprune.experiments import speed, study
from headprune.measures.speed_stage import speed_stage

task, shared_task = task_fixtures("nli")

SMALL = [
    "study.train=false",
    "study.n_samples=20",
    "study.extra_splits=[]",
    "prune.step=0.5",
    "speed.batch_sizes=[2,4]",
    "speed.examples=4",
    "speed.warmup=0",
    "speed.repeats=1",
    "speed.max_seconds=1e-9",  # runs out before any timed pass
]


def test_speed_stage_records_untimed_rows_and_keeps_the_rest(shared_task, tmp_path):
    mask = shared_task.gates.ones()
    mask["enc_self"][0, 0] = 0
    result = speed_stage(shared_task, mask, speed_settings(batch_sizes=[2, 4], examples=4, warmup=0, repeats=1, max_seconds=1e-9), 0)
    assert result["rows"] == [] and result["verdict"] == NOT_TIMED
    assert [(r["batch_size"], r["verdict"]) for r in result["not_timed"]] == [(2, NOT_TIMED), (4, NOT_TIMED)]
    assert result["score_check"]["agree"] and result["cost"]["pruned"]["parameters"] < result["cost"]["original"]["parameters"]


def test_speed_experiment_on_a_slow_machine_writes_the_untimed_verdict(shared_task, tmp_path, capsys):
    result = speed.run(make_cfg(tmp_path, "speed", "nli", *[o for o in SMALL if o.startswith("speed.")]))
    assert result["objective"] is None and results(tmp_path)["results"]["verdict"] == NOT_TIMED
    assert f"[speed] {NOT_TIMED}" in capsys.readouterr().out.splitlines()[-1]


def test_study_on_a_slow_machine_keeps_every_other_stage(shared_task, tmp_path, capsys):
    study.run(make_cfg(tmp_path, "study", "nli", *SMALL))
    payload = results(tmp_path)["results"]
    assert payload["speed"]["verdict"] == NOT_TIMED and payload["speed"]["rows"] == []
    assert payload["ablate"]["splits"]["eval"]["delta"] and payload["keep_one"]["rows"]
    assert set(payload["prune"]["orders"]) == {"importance", "ablation", "entropy", "random"}
    assert json.loads((tmp_path / "stages" / "speed.json").read_text())["results"]["verdict"] == NOT_TIMED
    assert f"[study] speed: {NOT_TIMED}" in capsys.readouterr().out.splitlines()[-1]


def test_study_command_exits_0_when_no_timing_fits(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "headprune.cli", "experiment=study", *NLI, "logger=none", "device=cpu", *SMALL]
    command += [f"hydra.run.dir={tmp_path}/run", f"paths.data_dir={tmp_path}/data"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    payload = json.loads((tmp_path / "run" / "results.json").read_text())["results"]
    assert payload["speed"]["verdict"] == NOT_TIMED and payload["prune"]["orders"] and payload["keep_one"]["rows"]
    assert NOT_TIMED in done.stdout
