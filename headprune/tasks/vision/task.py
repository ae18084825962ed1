"""ImageClassificationModule: fine-tune and evaluate a ViT/DeiT image classifier under head gates (the task protocol).

``experiment=vit_finetune`` runs :func:`finetune`; experiments that need a trained image classifier call
:func:`load_vision_task` (``model.pretrained=<dir of a fine-tuned model>``).
"""

from __future__ import annotations

import time

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics.classification import MulticlassAccuracy

from headprune.core.gates import HeadGates
from headprune.results.writer import texts_fingerprint
from headprune.tasks.base import EvalResult
from headprune.tasks.common import ClassifierSubsets, SharedTaskMethods, checked_settings
from headprune.tasks.vision.data import ImageDataModule
from headprune.tasks.vision.optim import adamw_with_linear_warmup
from headprune.tasks.vision.processor import build_processor, image_geometry, image_tokens

TASK_SETTINGS = ("lr", "weight_decay", "warmup_ratio", "warmup_steps", "exact_eval")  # task.* besides name (conf/task/vision.yaml)
TOKEN_POSITIONS = "input_ids"  # timing batches carry the patch-token positions (B, T): the speed experiment counts rows and tokens by them


class ImageClassificationModule(ClassifierSubsets, SharedTaskMethods, L.LightningModule):
    """An image classifier under HeadGates: Lightning training plus the task protocol of headprune.tasks.base."""

    IMPORTANCE_EXAMPLE = 150

    name = "vision"
    metric = "accuracy"
    higher_is_better = True
    paired_test_name = "paired bootstrap (Koehn 2004)"
    selection_split = "importance"  # held out of the training images, never the evaluation data

    def __init__(
        self,
        model: nn.Module,
        processor=None,
        data: ImageDataModule | None = None,
        *,
        lr: float,
        weight_decay: float,
        warmup_ratio: float,
        warmup_steps: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["model", "processor", "data"])
        self.model = model
        self.tokenizer = processor  # the protocol's input processor: saved beside the model
        self.data = data
        self.gates = HeadGates(model)
        model.eval()
        self.eval_splits = list(data.eval_splits) if data is not None else ["eval"]
        classes = model.config.num_labels
        self.val_accuracy = nn.ModuleDict({f"acc_{s}": MulticlassAccuracy(num_classes=classes, average="micro") for s in self.eval_splits})
        self._tokens: int | None = None

    # ---- Lightning ---------------------------------------------------------------------------
    def forward(self, batch: dict) -> torch.Tensor:
        """Logits (B, classes) of a batch's pixel_values (other keys are ignored)."""
        return self.model(pixel_values=batch["pixel_values"]).logits

    def on_train_epoch_start(self) -> None:
        self.model.train()

    def on_train_end(self) -> None:
        self.model.eval()

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

    # ---- task protocol -----------------------------------------------------------------------
    def _require_data(self) -> ImageDataModule:
        if self.data is None:
            raise ValueError("this task has no images: build it with load_vision_task(cfg) or ImageClassificationModule(..., data=...)")
        return self.data

    def data_fingerprint(self, split: str) -> str:
        """A hash of the split's images (pixels before resizing) and labels."""
        return texts_fingerprint(self._require_data().dataset(split).fingerprints)

    def _result(self, correct: torch.Tensor) -> EvalResult:
        n = len(correct)
        return EvalResult(score=100.0 * int(correct.sum()) / max(n, 1), metric=self.metric, n=n, per_example={"correct": correct.tolist()})

    @torch.no_grad()
    def evaluate(self, mask=None, split: str = "eval", batch_size: int | None = None, on_batch=None) -> EvalResult:
        """Accuracy (percent) on ``split`` with heads gated by ``mask``; per_example["correct"] is in dataset order;
        ``on_batch(n)`` after each batch of ``n`` examples."""
        data = self._require_data()
        correct = torch.zeros(len(data.dataset(split)), dtype=torch.long)
        was_training = self.model.training
        self.model.eval()
        try:
            with self.gates.masked(mask):
                for batch in data.loader(split, batch_size):
                    logits = self(self._to_device(batch))
                    correct[batch["idx"]] = (logits.argmax(-1).cpu() == batch["labels"]).long()
                    if on_batch is not None:
                        on_batch(len(batch["idx"]))
        finally:
            self.model.train(was_training)
        return self._result(correct)

    def evaluate_many(self, masks: list, split: str = "eval", on_batch=None, max_rows: int = 128) -> list[EvalResult]:
        """Scores of several masks, many masks per forward pass (headprune.engine.ablation); ``on_batch(n)`` after each batch."""
        from headprune.engine.ablation import MaskBatcher

        if not masks:
            return []
        if not MaskBatcher.takes(self.gates):  # residual channels change every layer: one plain pass per mask
            return [self.evaluate(m, split, on_batch=on_batch if i == 0 else None) for i, m in enumerate(masks)]
        data = self._require_data()
        correct = torch.zeros(len(masks), len(data.dataset(split)), dtype=torch.long)
        engine = MaskBatcher(self.model, self.gates, max_rows=max_rows)
        was_training = self.model.training
        self.model.eval()
        try:
            for batch in data.loader(split):
                idx, labels = batch.pop("idx"), batch.pop("labels")
                logits = engine.logits(self._to_device(batch), masks)  # (M, B, classes)
                correct[:, idx] = (logits.argmax(-1).cpu() == labels.unsqueeze(0)).long()
                if on_batch is not None:
                    on_batch(len(idx))
        finally:
            self.model.train(was_training)
        return [self._result(c) for c in correct]

    def training_batches(self, examples: int, seed: int = 0) -> list[dict]:
        """``examples`` training images drawn with ``seed``, in batches of the training batch size."""
        data = self._require_data()
        train = data.dataset("train")
        chosen = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed))[: max(int(examples), 0)].tolist()
        size = int(data.config.batch_size)
        batches = []
        for start in range(0, len(chosen), size):
            batch = data.collate_rows(train, chosen[start : start + size])
            batches.append(self._to_device(batch))
        return batches

    # ---- timing ------------------------------------------------------------------------------
    def tokens_per_image(self) -> int:
        """Tokens the encoder sees per image (patches plus CLS, and DeiT's distillation token)."""
        if self._tokens is None:
            self._tokens = image_tokens(self.model)
        return self._tokens

    def forward_batches(self, split: str) -> list[dict]:
        """The split's pixel batches with their token positions (B, T), what the speed experiment counts by."""
        batches = []
        for batch in self._require_data().loader(split):
            rows = batch["pixel_values"].shape[0]
            positions = torch.arange(self.tokens_per_image()).expand(rows, -1)
            batches.append({"pixel_values": batch["pixel_values"], TOKEN_POSITIONS: positions.clone()})
        return batches

    def timed_call(self, batch: dict) -> None:
        """One forward pass of the model on a timing batch's images."""
        self.model(pixel_values=batch["pixel_values"])


def _task_settings(cfg) -> dict:
    """``task.*`` (conf/task/vision.yaml), every setting present and none unknown."""
    task = checked_settings(cfg, TASK_SETTINGS, "vision", "conf/task/vision.yaml")
    task["lr"], task["weight_decay"], task["warmup_ratio"] = float(task["lr"]), float(task["weight_decay"]), float(task["warmup_ratio"])
    return task


def label_settings(cfg) -> dict:
    """The classes of the model's head: the data's own where it names them before reading images (a folder's
    subfolders, the ten digits: num_labels, id2label and label2id), else ``model.num_labels`` (a hub dataset)."""
    from headprune.tasks.vision.config import ImageDataConfig
    from headprune.tasks.vision.image_sources import class_names

    names = class_names(ImageDataConfig.from_cfg(cfg.data))
    if not names:
        return {"num_labels": int(cfg.model.num_labels)}
    return {"num_labels": len(names), "id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def build_image_model(cfg):
    """The image classifier of ``cfg.model`` with the data's classes (``label_settings``; a pretrained hub head of other
    classes is replaced)."""
    from pathlib import Path

    from headprune.core.saving import RECORD_FILE
    from headprune.models.sources import resolve_pretrained
    from headprune.tasks.registry import build_task_model

    overrides = label_settings(cfg)
    pretrained = cfg.model.get("pretrained")
    if pretrained and not (Path(resolve_pretrained(str(pretrained))) / RECORD_FILE).exists():
        overrides["ignore_mismatched_sizes"] = True  # a hub head of other classes (ImageNet's 1,000) is replaced
    return build_task_model(cfg.model, seed=int(cfg.seed), **overrides)


def load_vision_task(cfg) -> ImageClassificationModule:
    """The image data and ImageClassificationModule described by a Hydra config."""
    settings = _task_settings(cfg)
    settings.pop("exact_eval")
    model = build_image_model(cfg)
    processor = build_processor(cfg.model, model)
    _, channels = image_geometry(model)
    data = ImageDataModule.from_config(cfg.data, processor, channels, int(model.config.num_labels))
    data.setup()
    return ImageClassificationModule(model, processor, data, **settings)


def finetune(cfg) -> dict:
    """experiment=vit_finetune: fine-tune, validate, save <output_dir>/model (with its image processor), exact eval accuracy."""
    from omegaconf import OmegaConf

    from headprune.lightning.trainer import fit
    from headprune.results.writer import output_dir, update_results

    start = time.perf_counter()
    L.seed_everything(cfg.seed, workers=True)
    module = load_vision_task(cfg)
    print(module.data.describe(), flush=True)
    metrics = fit(cfg, module, module.data)
    if module.global_rank != 0:
        return metrics
    metrics.update(split_sizes=module.split_sizes())
    if _task_settings(cfg)["exact_eval"]:
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
