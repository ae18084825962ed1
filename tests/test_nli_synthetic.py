"""Acceptance guard: `headprune experiment=nli_finetune data=nli_synthetic` (MiniLM, W&B offline) reaches >= 95%.

The slowest NLI test (about 2-3 minutes on 2 shared CPU cores): it runs the real command with no
overrides but the run directory, so it guards the whole pipeline (config, data, Lightning, W&B
offline logging, saving, the exact re-evaluation).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # trains to 95% accuracy

ROOT = Path(__file__).resolve().parents[1]
BOUND_S = 600  # generous: the target is 3 minutes on an idle 2-core machine; 5 min measured with 3 other jobs running


def test_synthetic_finetune_reaches_95_percent(tmp_path):
    cli = Path(sys.executable).parent / "headprune"
    command = [
        str(cli) if cli.exists() else sys.executable,
        *([] if cli.exists() else ["-m", "headprune.cli"]),
        "experiment=nli_finetune",
        "data=nli_synthetic",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
    ]
    env = {**os.environ, "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.perf_counter()
    out = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - start
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert results["eval/accuracy_exact"] >= 95.0, results
    assert results["eval/correct"] == round(results["eval/accuracy"] * results["eval/n"])
    assert list((tmp_path / "wandb").glob("offline-run-*")), "the W&B run should be offline, under the run directory"
    assert wall < BOUND_S, f"took {wall:.0f}s"
