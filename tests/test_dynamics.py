"""Training dynamics: the live callback survives an interruption, and the offline analysis agrees with it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a training run in a subprocess

ROOT = Path(__file__).resolve().parent.parent
TINY = [
    "data=nli_synthetic",
    "model=tiny_bert",
    "data.synthetic.train_size=240",
    "data.synthetic.eval_size=60",
    "data.synthetic.mismatched_size=60",
    "data.importance_size=40",
    "task.lr=2e-3",
    "trainer.log_every_n_steps=1",
]


def _headprune(*overrides, timeout=420):
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    result = subprocess.run(
        [sys.executable, "-m", "headprune.cli", *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory):
    """Train 1 epoch (the run stops there, as an interruption would), then resume from last.ckpt to 3 epochs."""
    run_dir = tmp_path_factory.mktemp("dynamics") / "run"
    common = ["experiment=nli_finetune", "callbacks=head_dynamics", f"hydra.run.dir={run_dir}", *TINY]
    _headprune(*common, "logger=wandb", "trainer.max_epochs=1")
    first = json.loads((run_dir / "dynamics.json").read_text())["snapshots"]
    _headprune(*common, "logger=csv", "trainer.max_epochs=3", "ckpt_path=last")
    return run_dir, first


def test_series_is_continuous_after_resume(interrupted_run):
    run_dir, first = interrupted_run
    snapshots = json.loads((run_dir / "dynamics.json").read_text())["snapshots"]
    assert [s["epoch"] for s in first] == [0]
    assert [s["epoch"] for s in snapshots] == [0, 1, 2]
    steps = [s["step"] for s in snapshots]
    assert steps == sorted(set(steps)) and steps[0] > 0
    assert snapshots[0] == {**first[0], "rank_stability": None} or snapshots[0]["scores"] == first[0]["scores"]
    for snap in snapshots:
        assert snap["fractions"][0] == 0.0 and len(snap["scores"]) == len(snap["fractions"]) == 10
        assert snap["scores"][0] == snap["unpruned"]
    assert all(s["rank_stability"] is not None for s in snapshots[1:])


def test_offline_analysis_equals_live_callback(interrupted_run, tmp_path):
    run_dir, _ = interrupted_run
    live = json.loads((run_dir / "dynamics.json").read_text())["snapshots"]
    out = tmp_path / "offline"
    _headprune("experiment=dynamics", f"ckpt_dir={run_dir / 'checkpoints'}", f"hydra.run.dir={out}")
    offline = json.loads((out / "dynamics.json").read_text())["snapshots"]
    assert [s["epoch"] for s in offline] == [s["epoch"] for s in live]
    for a, b in zip(live, offline):
        assert a["scores"] == b["scores"] and a["step"] == b["step"]
        for group in a["importance"]:
            for row_a, row_b in zip(a["importance"][group], b["importance"][group]):
                assert row_a == pytest.approx(row_b, abs=1e-6)
    assert (out / "dynamics_pruning_curves.png").stat().st_size > 10_000
    assert (out / "dynamics_importance.png").stat().st_size > 10_000
    _headprune("experiment=report", f"run_dir={out}", f"hydra.run.dir={tmp_path / 'report'}")
    report = (out / "report.md").read_text()
    assert "| epoch | unpruned accuracy |" in report and "dynamics_pruning_curves.png" in report
    assert (out / "report.html").exists()


def test_wandb_offline_run_holds_the_charts(interrupted_run):
    run_dir, _ = interrupted_run
    runs = list((run_dir / "wandb").glob("offline-run-*"))
    assert runs, "no offline W&B run directory"
    images = list(runs[0].glob("files/media/images/dynamics/*.png"))
    assert images, f"no importance heatmap logged in {runs[0]}"
    assert list(runs[0].glob("run-*.wandb"))
