"""Every benchmark runs to the end in its smoke mode (tiny sizes), so a broken benchmark fails the suite."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(p.name for p in BENCH.glob("bench_*.py")))
def test_benchmark_smoke_mode_runs(script):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    done = subprocess.run(
        [sys.executable, str(BENCH / script), "--smoke", "--threads", "1"]
        if script != "bench_speed_noise.py"
        else [sys.executable, str(BENCH / script), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=BENCH.parent,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip(), "the benchmark printed nothing"
