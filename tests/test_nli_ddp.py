"""trainer=ddp_cpu: the real CLI runs Lightning DDP over two CPU processes (gloo); both ranks end with identical weights."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # DDP over two processes

ROOT = Path(__file__).resolve().parents[1]


def test_ddp_two_cpu_processes_end_identical(tmp_path):
    cli = Path(sys.executable).parent / "headprune"
    command = [
        str(cli) if cli.exists() else sys.executable,
        *([] if cli.exists() else ["-m", "headprune.cli"]),
        "experiment=nli_finetune",
        "trainer=ddp_cpu",
        "model=tiny_bert",
        "data=nli_synthetic",
        "logger=none",
        "data.synthetic.train_size=300",
        "data.synthetic.eval_size=40",
        "data.synthetic.mismatched_size=20",
        "data.importance_size=20",
        "data.batch_size=8",
        "trainer.max_steps=5",
        "task.exact_eval=false",
        "trainer.enable_progress_bar=false",
        "+callbacks.weights_digest._target_=weights_digest.WeightsDigest",  # tests/weights_digest.py
        f"hydra.run.dir={tmp_path}",
    ]
    python_path = os.pathsep.join(p for p in (str(ROOT / "tests"), str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "PYTHONPATH": python_path}
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    assert "distributed_backend=gloo" in out.stdout + out.stderr
    digests = [(tmp_path / "weights_digest" / f"rank{r}.txt").read_text().split() for r in (0, 1)]
    assert digests[0] == digests[1] and digests[0][1] == "step=5"
    assert (tmp_path / "model" / "config.json").exists()  # rank 0 saved the HF model
