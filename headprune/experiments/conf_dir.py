"""Where the Hydra configs live: headprune/conf inside an installed wheel, else conf/ at the top of the source tree."""

from __future__ import annotations

from pathlib import Path


def config_dir() -> str:
    """The Hydra config directory (the one holding config.yaml)."""
    package = Path(__file__).resolve().parents[1]
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"no Hydra config (config.yaml) in {package / 'conf'} or {package.parent / 'conf'}: reinstall headprune")
