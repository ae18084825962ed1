"""What the classification tasks (NLI, images) share: Lightning training, the task protocol and the fine-tune run."""

import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from headprune.core.inputs import eval_mode
from headprune.core.units import model_gates
from headprune.tasks.base import EvalResult
from headprune.tasks.common import SharedTaskMethods, checked_settings, drawn_groups

TASK_SETTINGS = ("lr", "weight_decay", "warmup_ratio", "warmup_steps", "exact_eval")  # task.* besides name (conf/task/<task>.yaml)


def classifier_settings(cfg, task_name: str, config_file: str) -> dict:
    """``task.*`` of a classifier task (``config_file``) but exact_eval (finetune's): every setting present, none unknown, numbers (ranges: TRAINER_SCHEMA)."""
    task = checked_settings(cfg, TASK_SETTINGS, task_name, config_file)
    try:
        task["lr"], task["weight_decay"], task["warmup_ratio"] = float(task["lr"]), float(task["weight_decay"]), float(task["warmup_ratio"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"task.lr, task.weight_decay and task.warmup_ratio must be numbers: {err}") from None
    task.pop("exact_eval")
    return task


class ClassifierTask(SharedTaskMethods, L.LightningModule):
    """A classifier task: Lightning training (cross-entropy, loss and accuracy per evaluation split) and the task protocol."""

    IMPORTANCE_EXAMPLE = 2000
    sort_training = True  # training batches of examples of similar lengths (little padding)
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

    def configure_optimizers(self) -> dict:
        """AdamW (no decay on biases and norms) with a linear warm-up and decay over the trainer's steps."""
        from transformers import get_linear_schedule_with_warmup

        hp, total_steps = self.hparams, self.trainer.estimated_stepping_batches
        trained = [param for param in self.model.parameters() if param.requires_grad]
        decay, no_decay = [p for p in trained if p.dim() >= 2], [p for p in trained if p.dim() < 2]  # biases and norms: 1-D
        groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        optimizer = torch.optim.AdamW(groups, lr=hp.lr)
        if not total_steps or total_steps == float("inf"):
            raise ValueError("cannot size the learning-rate schedule: set trainer.max_epochs or trainer.max_steps")
        warmup = hp.warmup_steps if hp.warmup_steps is not None else int(hp.warmup_ratio * int(total_steps))
        scheduler = get_linear_schedule_with_warmup(optimizer, warmup, int(total_steps))
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _require_data(self):
        if self.data is None:
            raise ValueError(f"this {type(self).__name__} has no data: build it with tasks.registry.load_task(cfg) or pass it data")
        return self.data

    def split_sizes(self) -> dict[str, int]:
        """{split: examples} of every split of the task's data (train, importance, eval, and eval_mismatched where present)."""
        data = self._require_data()
        return {split: len(data.dataset(split)) for split in data.splits}

    def paired_test(self, baseline, systems: list, n_samples: int = 1000, seed: int = 0, alpha: float = 0.01) -> list:
        """Paired bootstrap of accuracy on per-example correctness."""
        from headprune.scoring.significance import paired_bootstrap_accuracy

        correct = [s.per_example["correct"] for s in systems]
        return paired_bootstrap_accuracy(baseline.per_example["correct"], correct, n_samples=n_samples, seed=seed, alpha=alpha)

    def importance_batches(self, batch_size: int | None = None):
        """Batches (model inputs + labels, on the model's device) of the fixed importance subset of the training data."""
        data = self._require_data()
        if len(data.dataset("importance")) == 0:
            raise ValueError(
                f"the importance subset is empty (data.importance_size={data.config.importance_size}): set "
                f"data.importance_size to a number of training examples, e.g. {self.IMPORTANCE_EXAMPLE}"
            )
        yield from map(self._to_device, data.loader("importance", batch_size))

    def training_batches(self, examples: int, seed: int = 0) -> list[dict]:
        """``examples`` training examples drawn with ``seed``, in batches of the training batch size (``sort_training``: similar lengths, shuffled)."""
        data = self._require_data()
        train = data.dataset("train")
        length = (lambda i: train.lengths[i]) if self.sort_training else None
        groups = drawn_groups(len(train), examples, seed, int(data.config.batch_size), length)
        return [self._to_device(data.collate([train[i] for i in group])) for group in groups]

    def per_example_loss(self, batch: dict) -> torch.Tensor:
        """Cross-entropy of each example, shape (B,)."""
        return F.cross_entropy(self(batch), batch["labels"], reduction="none")

    def evaluate(self, mask=None, split: str = "eval", batch_size: int | None = None, on_batch=None) -> EvalResult:
        """Accuracy (percent) on ``split`` under ``mask``, per_example["correct"] in dataset order; ``on_batch(n)`` after each batch."""
        with self.gates.masked(mask):  # in eval mode, no dropout: masked and pruned models give identical scores
            return self._accuracies(split, 1, lambda batch: self(batch).unsqueeze(0), batch_size, on_batch)[0]

    def evaluate_many(self, masks: list, split: str = "eval", on_batch=None, max_rows: int = 128) -> list[EvalResult]:
        """Scores of several masks, batched: many masks per forward pass, unchanged lower layers reused (headprune.engine.ablation)."""
        from headprune.engine.ablation import MaskBatcher

        if not masks:
            return []
        if not MaskBatcher.takes(self.gates):  # residual channels change every layer: one plain pass per mask
            return [self.evaluate(m, split, on_batch=on_batch if i == 0 else None) for i, m in enumerate(masks)]
        engine = MaskBatcher(self.model, self.gates, max_rows=max_rows)
        return self._accuracies(split, len(masks), lambda batch: engine.logits(batch, masks), on_batch=on_batch)

    @torch.no_grad()
    def _accuracies(self, split: str, count: int, logits_of, batch_size: int | None = None, on_batch=None) -> list[EvalResult]:
        """``count`` accuracies on ``split`` from ``logits_of(model inputs)`` (count, B, C) per batch; ``on_batch(n)`` after each."""
        n = len(self._require_data().dataset(split))
        correct = torch.zeros(count, n, dtype=torch.long)
        with eval_mode(self.model):
            for batch in self._require_data().loader(split, batch_size):
                idx, labels = batch.pop("idx"), batch.pop("labels")
                correct[:, idx] = (logits_of(self._to_device(batch)).argmax(-1).cpu() == labels.unsqueeze(0)).long()
                if on_batch is not None:
                    on_batch(len(idx))
        return [
            EvalResult(score=100.0 * int(c.sum()) / max(n, 1), metric=self.metric, n=n, per_example={"correct": c.tolist()})
            for c in correct
        ]


def finetune_classifier(cfg, load_task, train_examples: bool = False) -> dict:
    """Fine-tune, validate, save <output_dir>/model and record split sizes (``train_examples``: the training split's too) and exact accuracies."""
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
    sizes = module.split_sizes()
    metrics.update({"train_examples": sizes["train"]} if train_examples else {}, split_sizes=sizes)
    if bool(cfg.task.exact_eval):  # checked by load_task
        for split in module.eval_splits:
            result = module.evaluate(split=split)
            correct = sum(result.per_example["correct"])
            metrics.update({f"{split}/accuracy_exact": result.score, f"{split}/correct": correct, f"{split}/n": result.n})
            print(f"{split}: accuracy {result.score:.2f}% ({correct}/{result.n})", flush=True)
    metrics["wall_seconds"] = time.perf_counter() - start
    metrics["objective"] = metrics.get("eval/accuracy_exact", metrics.get("eval/accuracy"))
    update_results(output_dir(cfg) / "results.json", metrics, OmegaConf.to_container(cfg, resolve=True))
    return metrics
