"""What every task offers the experiments: evaluation under a head mask, importance batches, per-example loss."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Protocol

import torch


@dataclass
class EvalResult:
    """A score on one evaluation set plus what a paired significance test needs."""

    score: float  # accuracy in percent (NLI) or corpus BLEU (MT)
    metric: str  # "accuracy" or "bleu"
    n: int  # examples evaluated
    per_example: dict = field(default_factory=dict)  # NLI: {"correct": [0/1...]}; MT: {"hypotheses": [...], "references": [...]}


class HeadTask(Protocol):
    """The interface that experiments use; NLIModule and TranslationModule implement it."""

    gates: object  # headprune.heads.HeadGates on self.model
    metric: str

    def evaluate(self, mask=None, split: str = "eval") -> EvalResult:
        """Score the model on ``split`` with heads gated by ``mask`` ({group: [L, H]} or None)."""

    def evaluate_many(self, masks: list, split: str = "eval", on_batch=None) -> list[EvalResult]:
        """Score several masks, batched; ``on_batch(n)`` is called after each data batch of ``n`` examples."""

    def importance_batches(self) -> Iterable[dict]:
        """Model-input batches (with labels) of the fixed importance subset of the *training* split."""

    def per_example_loss(self, batch: dict) -> torch.Tensor:
        """Loss of each example in a batch, shape (B,)."""
