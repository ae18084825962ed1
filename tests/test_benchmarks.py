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


@pytest.mark.slow
def test_llm_decode_benchmark_times_an_uneven_kv_group_mask_from_a_file(tmp_path):
    import json

    (tmp_path / "mask.json").write_text(json.dumps({"mask": {"dec_self": [[1, 0], [1, 1]]}}))  # layer 1 keeps 1 KV head, layer 2 both
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    args = ["--smoke", "--threads", "1", "--mask-file", str(tmp_path / "mask.json")]
    done = subprocess.run(
        [sys.executable, str(BENCH / "bench_llm_decode.py"), *args], capture_output=True, text=True, env=env, timeout=600, cwd=BENCH.parent
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "2/8 query heads pruned" in done.stdout and "pruned generation == masked generation: True" in done.stdout, done.stdout
    assert "KV cache x1.333 smaller" in done.stdout, done.stdout
