"""experiment=vit_finetune: an image classifier (ViT, DeiT) fine-tuned (scikit-learn's digits by default, offline), by the task's own trainer."""

from headprune.checks.shared_checks import check_training_run
from headprune.tasks.registry import train_task

TRAINS = True  # a task's trainer: reads the training settings (trainer, callbacks, ckpt_path)
run = train_task  # fine-tune, validate and save the image classifier with the vision task's trainer
check = check_training_run  # the model and task, the trainer, and the checkpoint to resume
