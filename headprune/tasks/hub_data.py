"""Hugging Face hub datasets: refused before any work when neither the hub nor the datasets cache can give them."""

from pathlib import Path

from headprune.core.checks import ConfigError
from headprune.models.sources import hub_reachable


def datasets_cache_dir(path: str) -> Path:
    """Where ``datasets.load_dataset(path)`` keeps its prepared copy (what it reads when the hub cannot be reached)."""
    import datasets
    from datasets.naming import camelcase_to_snakecase

    parts = path.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    return Path(datasets.config.HF_DATASETS_CACHE).expanduser() / "___".join(parts)


def check_hub_dataset(data, path, setting: str, instead: str) -> None:
    """A hub dataset that can be loaded now (local, cached or reachable); else a ConfigError naming it and ``instead``."""
    path = str(path)
    if Path(path).expanduser().exists() or any(p.is_dir() for p in datasets_cache_dir(path).glob("*/*/*")) or hub_reachable():
        return
    raise ConfigError(
        f"data={data.get('name')}: the Hugging Face dataset {setting}={path} is not in the datasets cache "
        f"({datasets_cache_dir(path).parent}) and the hub cannot be reached (offline): run once on a machine with a "
        f"network (the copy is cached there; set HF_DATASETS_CACHE to reuse it), or use {instead}"
    )
