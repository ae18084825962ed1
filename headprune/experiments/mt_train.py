"""experiment=mt_train: a translation model trained (mt_small from scratch on the synthetic set by default), by the task's own trainer."""

from headprune.checks.shared_checks import check_training_run
from headprune.tasks.registry import train_task

TRAINS = True  # a task's trainer: reads the training settings (trainer, callbacks, ckpt_path)
run = train_task  # train, validate (greedy BLEU each epoch), save the model, then beam-search corpus BLEU on data.eval_split
check = check_training_run  # the model and task, the trainer, and the checkpoint to resume
