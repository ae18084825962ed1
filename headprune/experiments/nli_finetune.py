"""experiment=nli_finetune: a sequence classifier fine-tuned on NLI (MNLI by default; data=nli_synthetic offline), by the task's own trainer."""

from headprune.checks.shared_checks import check_training_run
from headprune.tasks.registry import train_task

TRAINS = True  # a task's trainer: reads the training settings (trainer, callbacks, ckpt_path)


def run(cfg) -> dict:
    """Fine-tune, validate and save the classifier with the NLI task's trainer."""
    return train_task(cfg)


def check(cfg) -> None:
    """The model and task, the trainer, and the checkpoint to resume."""
    check_training_run(cfg)
