"""The sweep launchers compose, and a real multirun sweep of experiment=prune runs (local parallel jobs, W&B offline)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from experiment_helpers import CONF, NLI, ROOT
from hydra import compose, initialize_config_dir


@pytest.mark.parametrize(
    "launcher,target",
    [
        ("slurm", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
        ("slurm_cpu", "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"),
        ("local", "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher"),
    ],
)
def test_launcher_composes(launcher, target):
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=["experiment=prune", f"hydra/launcher={launcher}"], return_hydra_config=True)
    assert cfg.hydra.launcher._target_ == target
    if launcher == "slurm":
        assert cfg.hydra.launcher.gpus_per_node == 1 and cfg.hydra.launcher.timeout_min == 240
    elif launcher == "slurm_cpu":
        got = cfg.hydra.launcher
        assert (got.gpus_per_node, got.cpus_per_task, got.mem_gb, got.partition, got.timeout_min) == (0, 1, 4, "cpu", 240)
    else:
        assert cfg.hydra.launcher.n_jobs == 2


@pytest.mark.slow
def test_multirun_prune_orders_in_parallel(tmp_path):
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "headprune.cli",
        "-m",
        "hydra/launcher=local",
        "experiment=prune",
        "prune.order=importance,random",
        "prune.step=0.5",
        "device=cpu",
        "logger=wandb",
        f"hydra.sweep.dir={tmp_path}",
        *NLI,
    ]
    result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stderr[-3000:]
    orders = set()
    for job in ("0", "1"):
        payload = json.loads((tmp_path / job / "results.json").read_text())
        orders |= set(payload["results"]["orders"])
        assert (tmp_path / job / "prune.png").exists()
        runs = list((tmp_path / job / "wandb").glob("offline-run-*"))
        assert runs, "W&B offline run missing"
        media = {p.parent.name for p in runs[0].glob("files/media/*/*")}
        assert media == {"table", "images"}, media  # the prune table and the curve
    assert orders == {"importance", "random"}
