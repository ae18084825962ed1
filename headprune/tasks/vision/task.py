"""ImageClassificationModule: fine-tune and evaluate a ViT/DeiT image classifier under head gates (the task protocol)."""

from pathlib import Path

import torch

from headprune.results.writer import texts_fingerprint
from headprune.tasks.classifier_training import ClassifierTask, classifier_settings, finetune_classifier
from headprune.tasks.vision.config import ImageDataConfig
from headprune.tasks.vision.data import ImageDataModule
from headprune.tasks.vision.processor import build_processor, image_geometry, image_tokens

TOKEN_POSITIONS = "input_ids"  # timing batches carry the patch-token positions (B, T): the speed experiment counts rows and tokens by them


class ImageClassificationModule(ClassifierTask):
    """An image classifier under head gates: Lightning training plus the task protocol of headprune.tasks.base."""

    IMPORTANCE_EXAMPLE = 150
    sort_training = False  # every image is as long: batches in the drawn order

    name = "vision"
    selection_split = "importance"  # held out of the training images, never the evaluation data

    def forward(self, batch: dict) -> torch.Tensor:
        """Logits (B, classes) of a batch's pixel_values (other keys are ignored)."""
        return self.model(pixel_values=batch["pixel_values"]).logits

    def data_fingerprint(self, split: str) -> str:
        """A hash of the split's images (pixels before resizing) and labels."""
        return texts_fingerprint(self._require_data().dataset(split).fingerprints)

    def forward_batches(self, split: str) -> list[dict]:
        """The split's pixel batches with their token positions (B, T), what the speed experiment counts by."""
        tokens = image_tokens(self.model)  # per image: its patches plus CLS (and DeiT's distillation token)
        return [
            {"pixel_values": batch["pixel_values"], TOKEN_POSITIONS: torch.arange(tokens).repeat(len(batch["pixel_values"]), 1)}
            for batch in self._require_data().loader(split)
        ]

    def timed_call(self, batch: dict) -> None:
        """One forward pass of the model on a timing batch's images."""
        self.model(pixel_values=batch["pixel_values"])


def label_settings(cfg) -> dict:
    """The classes of the model's head: the data's own (num_labels, id2label, label2id) where known, else ``model.num_labels``."""
    from headprune.tasks.vision.image_sources import class_names

    names = class_names(ImageDataConfig.from_cfg(cfg.data))
    if not names:
        return {"num_labels": int(cfg.model.num_labels)}
    return {"num_labels": len(names), "id2label": dict(enumerate(names)), "label2id": {name: i for i, name in enumerate(names)}}


def load_vision_task(cfg) -> ImageClassificationModule:
    """The image data and ImageClassificationModule described by a Hydra config: the model with the data's classes."""
    from headprune.core.saving import RECORD_FILE
    from headprune.models.sources import resolve_pretrained
    from headprune.tasks.registry import build_task_model

    settings = classifier_settings(cfg, "vision", "conf/task/vision.yaml")
    overrides = label_settings(cfg)
    pretrained = cfg.model.get("pretrained")
    if pretrained and not (Path(resolve_pretrained(str(pretrained))) / RECORD_FILE).exists():
        overrides["ignore_mismatched_sizes"] = True  # a hub head of other classes (ImageNet's 1,000) is replaced
    model = build_task_model(cfg.model, seed=int(cfg.seed), **overrides)
    processor = build_processor(cfg.model, model)
    _, channels = image_geometry(model)
    data = ImageDataModule(ImageDataConfig.from_cfg(cfg.data), processor, channels, int(model.config.num_labels))
    data.setup()
    return ImageClassificationModule(model, processor, data, **settings)


def finetune(cfg) -> dict:
    """experiment=vit_finetune: fine-tune, validate, save <output_dir>/model (with its image processor), exact eval accuracy."""
    return finetune_classifier(cfg, load_vision_task)
