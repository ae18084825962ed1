"""The groups every run composes: the top-level seed and device (conf/config.yaml), the logger, the trainer and its callbacks."""

from dataclasses import dataclass
from typing import Any

from headprune.core.checks import boolean, boolean_or, choice, integer, number, optional, rule
from headprune.lightning.loggers import LOGGER_KINDS
from headprune.settings.declare import COUNT, EVERY, NAME, TRAINING, section, setting

ALL = (EVERY,)
TRAINERS = (TRAINING,)
LIGHTNING = "passed to Lightning as given"


@dataclass(frozen=True)
class RootSettings:
    """The top-level settings of conf/config.yaml (its other keys, run, paths, ckpt_path and overwrite, are the run's plumbing)."""

    seed: int = setting(rule(integer), ALL)
    device: str = setting(NAME, ALL)


@dataclass(frozen=True)
class LoggerSettings:
    """logger: where a run logs (conf/logger/*.yaml; project, entity, mode and tags only with logger=wandb)."""

    kind: str = setting(rule(choice, choices=LOGGER_KINDS), ALL)
    project: str = setting(None, ALL, "the W&B project")
    entity: str | None = setting(None, ALL, "the W&B entity (null: the default one)")
    mode: str = setting(None, ALL, "the W&B mode (offline, online, disabled)")
    tags: list = setting(None, ALL, "the W&B run's tags")


@dataclass(frozen=True)
class TrainerSettings:
    """trainer: Lightning's Trainer for training runs (conf/trainer/*.yaml); any other Trainer argument may be added."""

    accelerator: str = setting(None, TRAINERS, LIGHTNING)
    devices: Any = setting(None, TRAINERS, LIGHTNING)
    num_nodes: int = setting(None, TRAINERS, LIGHTNING)
    strategy: str = setting(None, TRAINERS, LIGHTNING)
    precision: str = setting(None, TRAINERS, LIGHTNING)
    max_epochs: int | None = setting(optional(rule(integer, low=-1)), TRAINERS)
    max_steps: int = setting(rule(integer, low=-1), TRAINERS)
    val_check_interval: float = setting(None, TRAINERS, LIGHTNING)
    check_val_every_n_epoch: int | None = setting(optional(COUNT), TRAINERS)
    log_every_n_steps: int = setting(COUNT, TRAINERS)
    gradient_clip_val: float | None = setting(optional(rule(number, low=0.0)), TRAINERS)
    accumulate_grad_batches: int = setting(COUNT, TRAINERS)
    num_sanity_val_steps: int = setting(rule(integer, low=-1), TRAINERS)
    enable_progress_bar: bool = setting(rule(boolean), TRAINERS)
    enable_model_summary: bool = setting(rule(boolean), TRAINERS, added=True)  # Lightning's default: true
    deterministic: Any = setting(rule(boolean_or, words=("warn",)), TRAINERS)


@dataclass(frozen=True)
class CheckpointSettings:
    """callbacks.checkpoint: the checkpoint callback every training run adds."""

    every_n_epochs: int | None = setting(optional(COUNT), TRAINERS)
    every_n_train_steps: int | None = setting(optional(COUNT), TRAINERS)
    save_top_k: int = setting(rule(integer, low=-1), TRAINERS)
    monitor: str | None = setting(None, TRAINERS, "the metric that ranks checkpoints (null: the last ones)")


@dataclass(frozen=True)
class CallbacksSettings:
    """callbacks: Lightning callbacks of training runs (conf/callbacks/*.yaml); more may be added by name."""

    checkpoint: CheckpointSettings = section(CheckpointSettings)
    head_dynamics: Any = setting(None, TRAINERS, "the head-dynamics tracker: callbacks=head_dynamics (the dynamics.* settings)")
