"""The Hydra entry point ``headprune``: compose the config and run the chosen experiment."""
from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra.utils import get_method
from omegaconf import DictConfig

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def config_dir() -> str:
    """The Hydra config directory: headprune/conf inside an installed wheel, else conf/ at the top of the source tree."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "conf", package.parent / "conf"):
        if (candidate / "config.yaml").is_file():
            return str(candidate)
    raise FileNotFoundError(f"no Hydra config (config.yaml) in {package / 'conf'} or {package.parent / 'conf'}: reinstall headprune")


CONFIG_DIR = config_dir()


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig):
    """Check the config, run ``cfg.run`` (set by the experiment file) and return its optimized metric, if any."""
    from headprune.validation import validate

    validate(cfg)
    result = get_method(cfg.run)(cfg)
    if isinstance(result, dict):
        return result.get("objective")
    return result


if __name__ == "__main__":
    main()
