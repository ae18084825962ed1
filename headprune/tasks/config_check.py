"""What the tasks' config checks share: the classifier trainer settings, a readable importance subset, lengths the model takes."""

from headprune.core.checks import ConfigError, boolean, check_schema, integer, number, optional, rule
from headprune.models.sources import max_positions

TRAINER_SCHEMA = {
    "task.lr": rule(number, low=0.0, closed="()"),
    "task.weight_decay": rule(number, low=0.0),
    "task.warmup_ratio": rule(number, low=0.0, high=1.0),
    "task.warmup_steps": optional(rule(integer, low=0)),
    "task.exact_eval": rule(boolean),
}


def check_length_fits(cfg, setting: str, what: str) -> None:
    """``data.<setting>`` tokens per ``what`` within the model's positions; else a ConfigError naming both."""
    positions, length = max_positions(cfg.model), cfg.data.get(setting)
    if positions is not None and isinstance(length, int) and length > positions:
        raise ConfigError(
            f"data.{setting}={length} tokens per {what}, but model {cfg.model.get('name')} takes at most {positions} "
            f"positions: set data.{setting}<={positions}"
        )


def checked_data(cfg, schema: dict, config_class, importance: bool, example: str):
    """``config_class`` of ``cfg.data`` once ``schema`` holds; an empty importance subset refused where importance is read."""
    check_schema(cfg, schema)
    try:
        config = config_class.from_cfg(cfg.data)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    if importance and config.importance_size < 1:
        raise ConfigError(
            "data.importance_size=0 leaves the importance subset empty (head importance and the held-out choices "
            f"read it): set data.importance_size to a number of training {example}"
        )
    return config
