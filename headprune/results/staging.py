"""Outputs written aside and moved into place whole: a run killed mid-way leaves the previous outputs intact."""

import os
import shutil
from pathlib import Path


def fresh_dir(path: str | Path) -> Path:
    """An empty directory at ``path`` (what an earlier, interrupted run left there is removed)."""
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def replace_dir(staged: str | Path, final: str | Path) -> Path:
    """Move the finished ``staged`` directory to ``final``, replacing what was there (two renames, then the old one is deleted)."""
    staged, final = Path(staged), Path(final)
    old = final.with_name(f".{final.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(staged, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
