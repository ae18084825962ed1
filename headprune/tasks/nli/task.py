"""NLIModule: fine-tune and evaluate an HF sequence classifier on NLI, with head gates on the model."""

from contextlib import contextmanager
from pathlib import Path

import torch

from headprune.core.inputs import ENCODER_INPUTS
from headprune.results.writer import texts_fingerprint
from headprune.tasks.classifier_training import ClassifierTask, classifier_settings, finetune_classifier
from headprune.tasks.nli.data import NLIDataConfig, NLIDataModule, PadCollator
from headprune.tasks.nli.files import LABELS


class NLIModule(ClassifierTask):
    """A 3-way NLI classifier under head gates: Lightning training plus the task protocol of headprune.tasks.base."""

    name = "nli"
    selection_split = "importance"  # the held-out training subset (appendix A), never the evaluation data

    label_names = LABELS

    def forward(self, batch: dict) -> torch.Tensor:
        """Logits (B, classes) for a batch (extra keys such as labels and idx are ignored)."""
        return self.model(**{k: batch[k] for k in ENCODER_INPUTS if k in batch}).logits

    def data_fingerprint(self, split: str) -> str:
        """A hash of the split's premise/hypothesis pairs (of its labels when the texts are not kept)."""
        dataset = self._require_data().dataset(split)
        texts = getattr(dataset, "texts", {}) or {}
        pairs = [f"{p}\t{h}" for p, h in zip(texts.get("premise", []), texts.get("hypothesis", []))]
        return texts_fingerprint(pairs) if pairs else texts_fingerprint(map(str, dataset.labels))

    @contextmanager
    def split_by(self, split_row, tokenizer, splits: list[str]):
        """Within: ``splits`` hold their pairs split again by ``split_row`` into ``tokenizer``'s ids (a pruned vocabulary's own)."""
        data = self._require_data()
        own = {split: data.dataset(split) for split in splits}, data.collate, self.tokenizer
        data.datasets.update({split: pairs.split_again(split_row) for split, pairs in own[0].items()})
        data.collate, self.tokenizer = PadCollator(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0), tokenizer
        try:
            yield self
        finally:
            data.datasets.update(own[0])
            data.collate, self.tokenizer = own[1], own[2]

    def forward_batches(self, split: str) -> list[dict]:
        return list(self._require_data().loader(split))

    def token_rows(self, split: str):
        """Each example's token ids (special tokens included, no padding)."""
        return self._require_data().dataset(split).encodings["input_ids"]


def load_nli_task(cfg) -> NLIModule:
    """The datamodule and NLIModule described by a Hydra config (``model.pretrained=<dir>`` loads fine-tuned weights)."""
    from headprune.models.build import build_tokenizer
    from headprune.tasks.registry import build_task_model

    if cfg.get("data") is None:
        raise ValueError("no data chosen: add data=nli_local (../shared/data/mnli), data=nli_synthetic or data=nli_hub")
    if cfg.model.get("kind") != "classifier":
        raise ValueError(
            f"the NLI task needs a classifier model (model.kind=classifier), got model={cfg.model.get('name')} kind={cfg.model.get('kind')}"
        )
    pretrained = str(cfg.model.get("pretrained"))  # a path (not a hub name) must exist; None reads "None", not a path
    if pretrained.startswith((".", "/", "~")) and "/" in pretrained and not Path(pretrained).expanduser().exists():
        raise FileNotFoundError(f"model.pretrained={pretrained} does not exist (a fine-tuned model dir is <run>/model)")
    settings = classifier_settings(cfg, "NLI", "conf/task/nli.yaml")
    tokenizer = build_tokenizer(cfg.model)
    data = NLIDataModule(NLIDataConfig.from_cfg(cfg.data), tokenizer)
    data.setup()
    model = build_task_model(cfg.model, seed=int(cfg.seed))
    return NLIModule(model, tokenizer, data, **settings)


def finetune(cfg) -> dict:
    """experiment=nli_finetune: fine-tune, validate, save <output_dir>/model, and record exact dev accuracies."""
    return finetune_classifier(cfg, load_nli_task, train_examples=True)
