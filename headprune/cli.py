"""The Hydra entry point ``headprune``: compose the config and run the chosen experiment."""

from __future__ import annotations

import os

import hydra
from hydra.utils import get_method
from omegaconf import DictConfig

from headprune.experiments.conf_dir import config_dir

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


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
