"""One check of a composed experiment config before any work: settings, data files and the model directory."""

from importlib import import_module

from headprune.checks.shared_checks import check_training_run, warn_unknown_keys
from headprune.core.checks import ConfigError, check_schema
from headprune.selection.mask_search import given_target
from headprune.settings.renamed import check_renamed
from headprune.settings.schema import SCHEMA
from headprune.tasks.registry import TASKS


def check_of(cfg):
    """The check of ``cfg.run``: a task's trainer's, or its module's ``check``; an unknown run is a ConfigError."""
    name = str(cfg.get("run"))
    if any(name == spec.train for spec in TASKS.values()):
        return check_training_run
    module_name, _, function = name.rpartition(".")
    try:
        module = import_module(module_name) if module_name else None
    except ImportError:
        module = None
    if module is None or not callable(getattr(module, function, None)) or not callable(getattr(module, "check", None)):
        raise ConfigError(
            f"run={name} is no experiment headprune knows (none of its modules has a run and a check): "
            "choose one with experiment=<name> (conf/experiment/)"
        )
    return module.check


def unset_empty_target(cfg) -> None:
    """``prune.target`` with every kind null (the YAML default, so that ``prune.target.speedup=1.3`` works) is no target."""
    prune = cfg.get("prune")
    if prune is not None and prune.get("target") is not None and given_target(prune.target) is None:
        prune.target = None


def validate(cfg) -> None:
    """Check a composed experiment config before any work; the first problem is a ConfigError naming the setting."""
    check_renamed(cfg)
    unset_empty_target(cfg)
    warn_unknown_keys(cfg)
    check_schema(cfg, SCHEMA)
    check_of(cfg)(cfg)
