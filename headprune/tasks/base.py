"""The task protocol: everything an experiment may ask of a task (a new task implements it and adds a ``TaskSpec``)."""

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import nn


@dataclass
class EvalResult:
    """A score on one evaluation set plus what a paired significance test needs."""

    score: float  # the task's metric: accuracy in percent (NLI), corpus BLEU (MT), perplexity (LM)
    metric: str  # the metric's name, e.g. "accuracy", "bleu", "perplexity"
    n: int  # examples evaluated
    per_example: dict = field(default_factory=dict)  # what the task's paired_test resamples (e.g. {"correct": [0/1, ...]})
    loss: float | None = None  # mean per-example loss when the task computes it (None otherwise)
    measures: dict = field(default_factory=dict)  # further measures beside the score (LM: bits_per_byte, perplexity_per_byte)
    tokenizer: dict | None = None  # how the text was split when not by the task's tokenizer ({"own": True, ...}: a pruned vocabulary's)


def rows_of(batch: dict) -> int:
    """Examples in a batch: rows of its input ids, else of its first input (an image batch's pixel_values)."""
    return int((batch["input_ids"] if "input_ids" in batch else next(iter(batch.values()))).shape[0])


@dataclass(frozen=True)
class TimedCall:
    """One named inference call of the speed experiment and how to count what it processes."""

    call: Callable[[dict], None]  # one call on a timing batch (forward, generate, ...)
    unit: str = "examples"  # what ``count`` counts: "examples", "tokens", "new tokens"
    count: Callable[[dict], int] = rows_of  # units one call processes on a batch
    # (context before, after) per row of input_ids (B, T): FLOPs of the tokens in between
    span: Callable[[dict], tuple[int, int]] = lambda batch: (0, int(batch["input_ids"].shape[1]))


@runtime_checkable
class Task(Protocol):
    """What every experiment uses. NLIModule, TranslationModule and LanguageModelingTask implement it."""

    name: str  # short task name: "nli", "mt", "lm"
    metric: str  # name of the evaluation metric
    higher_is_better: bool  # direction of the metric (accuracy, BLEU: True; perplexity: False)
    paired_test_name: str  # what ``paired_test`` runs, written beside its results (e.g. "paired bootstrap (Koehn 2004)")
    model: nn.Module  # the HF model, gated by ``gates``
    gates: object  # its gates on ``model`` (headprune.core.units.model_gates; a Gates of headprune.core.kinds.gates_protocol)
    tokenizer: object  # the model's tokenizer (saved beside exported models)

    def split_sizes(self) -> Mapping[str, int]:
        """{split name: number of examples} for every split the task's data has (0 = empty); may count lazily."""

    @property
    def selection_split(self) -> str:
        """The held-out split for choices (keep-one's head, max_drop targets): never the evaluation split."""

    def data_fingerprint(self, split: str) -> str:
        """A hash of a split's texts: a resumed study reuses results only on the same data."""

    def split_summary(self) -> Mapping[str, Mapping[str, int]]:
        """{split: {"examples": n, ...}} for every split (a language-modelling task adds its token counts)."""

    def evaluate(self, mask=None, split: str = "eval", on_batch: Callable[[int], None] | None = None) -> EvalResult:
        """Score the model on ``split`` with heads gated by ``mask``; ``on_batch(n)`` after each data batch of ``n`` examples."""

    def evaluate_many(self, masks: list, split: str = "eval", on_batch: Callable[[int], None] | None = None) -> list[EvalResult]:
        """Score several masks, batched where the task can; ``on_batch(n)`` after each data batch of ``n`` examples."""

    def paired_test(self, baseline: EvalResult, systems: list[EvalResult], n_samples: int, seed: int, alpha: float) -> list:
        """Paired bootstrap of each system against the baseline: a list of headprune.scoring.significance.PairedResult."""

    def importance_batches(self) -> Iterable[dict]:
        """Model-input batches (with labels) of the fixed importance subset of the *training* data."""

    def training_batches(self, examples: int, seed: int = 0) -> list[dict]:
        """About ``examples`` shuffled training examples as model-input batches with labels (fine-tune recovery)."""

    def per_example_loss(self, batch: dict) -> torch.Tensor:
        """Forward a batch (labels kept out of the model's inputs) and return each example's loss, shape (B,)."""

    def timing_batches(self, batch_size: int, examples: int, split: str = "eval", seed: int = 0) -> list[dict]:
        """Model-input batches of ``batch_size`` for the speed experiment (``examples`` in all, drawn with ``seed``)."""

    def timed_call(self, batch: dict) -> None:
        """One inference call on a timing batch: what the speed experiment times (forward, generate, ...)."""

    def timed_calls(self) -> dict[str, TimedCall]:
        """{name: TimedCall} the speed experiment times, each on the same timing batches (NLI/MT: their one timed_call)."""

    def memory_measures(self, model: nn.Module) -> dict[str, int]:
        """Per-model sizes the speed experiment reports for the original and the pruned model (e.g. KV-cache bytes per token)."""
