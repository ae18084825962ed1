"""A fresh interpreter for an export's check: a clean environment, a folder of its own, and the JSON line it prints last."""

import json
import os
import subprocess
from pathlib import Path


def run_fresh(command: list[str], folder: Path, what: str, timeout: float, **env) -> object:
    """Run ``command`` in ``folder`` with only PATH, one thread and ``env``; its last stdout line as JSON, else a RuntimeError."""
    clean = {"PATH": os.environ.get("PATH", ""), "OMP_NUM_THREADS": "1", "HOME": str(folder), **env}
    done = subprocess.run(command, cwd=folder, env=clean, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
