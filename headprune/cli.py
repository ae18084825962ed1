"""The Hydra entry point ``headprune``: compose the config and run the chosen experiment."""
from __future__ import annotations

import os
from pathlib import Path

import hydra
from hydra.utils import get_method
from omegaconf import DictConfig

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
CONFIG_DIR = str(Path(__file__).resolve().parent.parent / "conf")  # the project's conf/ (editable install)


@hydra.main(version_base="1.3", config_path=CONFIG_DIR, config_name="config")
def main(cfg: DictConfig):
    """Run ``cfg.run`` (set by the experiment file) and return its optimized metric, if any."""
    result = get_method(cfg.run)(cfg)
    if isinstance(result, dict):
        return result.get("objective")
    return result


if __name__ == "__main__":
    main()
