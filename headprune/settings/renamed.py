"""Settings that were renamed: the old key is refused with the new one named."""

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError

RENAMED = {"prune.min_heads_per_layer": "prune.min_units_per_layer"}  # old key: new key
WHY = {"prune.min_units_per_layer": "the floor counts the pruning unit: heads, KV groups or blocks"}


def renamed_hint(override: str) -> str | None:
    """What to write instead of a command-line override of a renamed setting (None: not renamed)."""
    key, _, value = override.lstrip("+~").partition("=")
    new = RENAMED.get(key)
    return None if new is None else f"{key} is now {new} ({WHY[new]}): give {new}={value or '<k>'}"


def check_renamed(cfg) -> None:
    """A renamed setting given under its old key (``+prune.min_heads_per_layer=1``, an older config file) is refused."""
    for old in RENAMED:
        value = OmegaConf.select(cfg, old, default=None, throw_on_missing=False)
        if value is not None:
            raise ConfigError(renamed_hint(f"{old}={value}"))
