"""What the classification tasks (NLI, images) share of Lightning training: steps, optimizer and the fine-tune run."""

import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from headprune.core.units import model_gates
from headprune.tasks.common import checked_settings

TASK_SETTINGS = ("lr", "weight_decay", "warmup_ratio", "warmup_steps", "exact_eval")  # task.* besides name (conf/task/<task>.yaml)


def classifier_settings(cfg, task_name: str, config_file: str) -> dict:
    """``task.*`` of a classifier task (``config_file``) but exact_eval (finetune's), checked: every setting present, none unknown, numbers in range."""
    task = checked_settings(cfg, TASK_SETTINGS, task_name, config_file)
    try:
        task["lr"], task["weight_decay"], task["warmup_ratio"] = float(task["lr"]), float(task["weight_decay"]), float(task["warmup_ratio"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"task.lr, task.weight_decay and task.warmup_ratio must be numbers: {err}") from None
    if task["lr"] <= 0 or not 0 <= task["warmup_ratio"] <= 1:
        raise ValueError(f"need task.lr > 0 and 0 <= task.warmup_ratio <= 1, got lr={task['lr']} warmup_ratio={task['warmup_ratio']}")
    task.pop("exact_eval")
    return task


def adamw_with_linear_warmup(model, hp, total_steps) -> dict:
    """Lightning's optimizer dict: AdamW (no decay on biases and norms) with a linear warm-up and decay over ``total_steps``."""
    from transformers import get_linear_schedule_with_warmup

    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.dim() < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=hp.lr)
    if not total_steps or total_steps == float("inf"):
        raise ValueError("cannot size the learning-rate schedule: set trainer.max_epochs or trainer.max_steps")
    warmup = hp.warmup_steps if hp.warmup_steps is not None else int(hp.warmup_ratio * int(total_steps))
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, int(total_steps))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class ClassifierSteps:
    """Lightning steps of a classifier task: cross-entropy training, loss and accuracy per evaluation split."""

    metric = "accuracy"
    higher_is_better = True
    paired_test_name = "paired bootstrap (Koehn 2004)"

    label_names: tuple[str, ...] = ()  # the class names written into the model's config (when it has as many classes)

    def __init__(
        self,
        model: nn.Module,
        tokenizer=None,
        data=None,
        *,
        lr: float,
        weight_decay: float,
        warmup_ratio: float,
        warmup_steps: int | None = None,
        eval_splits: tuple[str, ...] | None = None,
    ):
        """Hold the model under its gates (in eval mode), its input processor, its data and an accuracy per evaluation split."""
        super().__init__()
        self.save_hyperparameters(ignore=["model", "tokenizer", "data"])
        names = self.label_names
        if names and getattr(model.config, "num_labels", len(names)) == len(names):
            model.config.id2label = dict(enumerate(names))
            model.config.label2id = {name: i for i, name in enumerate(names)}
        self.model, self.tokenizer, self.data = model, tokenizer, data
        self.gates = model_gates(model)
        model.eval()
        self.eval_splits = list(eval_splits if eval_splits is not None else data.eval_splits if data is not None else ["eval"])
        classes = model.config.num_labels
        self.val_accuracy = nn.ModuleDict({f"acc_{s}": MulticlassAccuracy(num_classes=classes, average="micro") for s in self.eval_splits})

    def on_train_epoch_start(self) -> None:
        self.model.train()  # HF models load in eval mode; dropout on while fitting

    def on_train_end(self) -> None:
        self.model.eval()  # outside fit the model stays deterministic (importance, evaluation)

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss = F.cross_entropy(self(batch), batch["labels"])
        self.log("train/loss", loss, prog_bar=True, batch_size=len(batch["labels"]))
        return loss

    def validation_step(self, batch: dict, batch_idx: int, dataloader_idx: int = 0) -> None:
        split = self.eval_splits[dataloader_idx]
        logits = self(batch)
        metric = self.val_accuracy[f"acc_{split}"]
        metric.update(logits.argmax(-1), batch["labels"])
        n = len(batch["labels"])
        self.log(f"{split}/loss", F.cross_entropy(logits, batch["labels"]), batch_size=n, sync_dist=True, add_dataloader_idx=False)
        self.log(f"{split}/accuracy", metric, batch_size=n, prog_bar=True, add_dataloader_idx=False)

    def configure_optimizers(self):
        return adamw_with_linear_warmup(self.model, self.hparams, self.trainer.estimated_stepping_batches)


def finetune_classifier(cfg, load_task, data_sizes) -> dict:
    """Fine-tune, validate, save <output_dir>/model and record exact accuracies (task.exact_eval); ``data_sizes(module)`` adds split sizes."""
    from omegaconf import OmegaConf

    from headprune.lightning.trainer import fit
    from headprune.results.writer import output_dir, update_results

    start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True)  # the classifier head's initialisation too
    module = load_task(cfg)
    print(module.data.describe(), flush=True)
    metrics = fit(cfg, module, module.data)
    if module.global_rank != 0:
        return metrics
    metrics.update(data_sizes(module))
    if bool(cfg.task.exact_eval):  # checked by load_task
        for split in module.eval_splits:
            result = module.evaluate(split=split)
            metrics[f"{split}/accuracy_exact"] = result.score
            metrics[f"{split}/correct"] = sum(result.per_example["correct"])
            metrics[f"{split}/n"] = result.n
            print(f"{split}: accuracy {result.score:.2f}% ({sum(result.per_example['correct'])}/{result.n})", flush=True)
    metrics["wall_seconds"] = time.perf_counter() - start
    metrics["objective"] = metrics.get("eval/accuracy_exact", metrics.get("eval/accuracy"))
    update_results(output_dir(cfg) / "results.json", metrics, OmegaConf.to_container(cfg, resolve=True))
    return metrics
