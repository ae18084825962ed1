"""How the deployer's tools record a path in their results files: never an absolute path of the machine."""

from __future__ import annotations

from pathlib import Path


def shown(path) -> str:
    """A path as results files record it: relative to the working directory when inside it, else its last two parts."""
    path = Path(path).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(Path(*path.parts[-2:]))
