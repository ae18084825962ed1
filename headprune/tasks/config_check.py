"""What the classifier tasks' config checks share (nli, vision): the trainer settings and a readable importance subset."""

from headprune.core.checks import ConfigError, boolean, check_schema, integer, number, optional, rule

TRAINER_SCHEMA = {
    "task.lr": rule(number, low=0.0, closed="()"),
    "task.weight_decay": rule(number, low=0.0),
    "task.warmup_ratio": rule(number, low=0.0, high=1.0),
    "task.warmup_steps": optional(rule(integer, low=0)),
    "task.exact_eval": rule(boolean),
}


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
