"""What the tasks share of the protocol in headprune.tasks.base: timing batches and the timed call."""

from collections.abc import Callable, Mapping
from pathlib import Path

import torch

from headprune.core.inputs import eval_mode
from headprune.core.saving import save_pruned
from headprune.tasks.base import EvalResult


def checked_settings(cfg, known, task_name: str, config_file: str) -> dict:
    """``task.*`` of a composed config: every setting of ``known`` present, none unknown (``name`` aside)."""
    given = {k: v for k, v in dict(cfg.get("task") or {}).items() if k != "name"}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown task setting(s) {unknown}; the {task_name} task settings are {sorted(known)}")
    missing = sorted(set(known) - set(given))
    if missing:
        raise ValueError(f"task setting(s) {missing} missing: compose the config with the {task_name} task group ({config_file})")
    return given


def drawn_groups(count: int, examples: int, seed: int, size: int, length: Callable[[int], int] | None = None) -> list[list[int]]:
    """``examples`` of ``count`` rows drawn with ``seed`` in groups of ``size``; by ``length``: similar lengths, groups in a seeded order."""
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(count, generator=generator)[: max(int(examples), 0)].tolist()
    if length is not None:
        chosen.sort(key=length)
    groups = [chosen[start : start + size] for start in range(0, len(chosen), size)]
    if length is None:
        return groups
    return [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]


class LazySizes(Mapping):
    """{split: examples} whose sizes are counted on first access (a large training split is read only when asked for)."""

    def __init__(self, splits, count: Callable[[str], int]):
        self._splits, self._count, self._known = list(splits), count, {}

    def __getitem__(self, split: str) -> int:
        if split not in self._splits:
            raise KeyError(split)
        if split not in self._known:
            self._known[split] = self._count(split)
        return self._known[split]

    def __iter__(self):
        return iter(self._splits)

    def __len__(self) -> int:
        return len(self._splits)

    def __repr__(self) -> str:
        return repr(dict(self))


class SavesHF:
    """``save_hf``: a task's model (HF format, pruning record included) and tokenizer written to a directory."""

    def save_hf(self, path) -> Path:
        """Write the model and its tokenizer to ``path`` (with the record of where the tokenizer came from, when known)."""
        from headprune.models.tokenizer_origin import keep_origin

        saved = save_pruned(self.model, path, tokenizer=self.tokenizer)
        keep_origin(self.tokenizer, path)
        return saved


class SharedTaskMethods(SavesHF):
    """Mixed into every task; a task provides ``forward_batches(split)`` (model inputs with targets, on the CPU)."""

    @property
    def model_device(self) -> torch.device:
        return next(self.model.parameters()).device

    def forward_batches(self, split: str) -> list[dict]:
        """The split's batches as the model's forward pass takes them (targets teacher-forced)."""
        raise NotImplementedError

    def token_rows(self, split: str):
        """Each example's input token ids (padding left out), from the split's forward batches."""
        for batch in self.forward_batches(split):
            mask = batch.get("attention_mask")
            for i, row in enumerate(batch["input_ids"]):
                yield row if mask is None else row[mask[i].bool()]

    def timing_batches(self, batch_size: int, examples: int, split: str = "eval", seed: int = 0) -> list[dict]:
        """Batches of ``batch_size`` random examples of ``split`` (about ``examples`` in all), on the model's device."""
        from headprune.engine.timing import example_pool, make_batches

        return make_batches(example_pool(self.forward_batches(split)), int(batch_size), examples, seed, self.model_device)

    def timed_call(self, batch: dict) -> None:
        """One forward pass of the model on a timing batch."""
        self.model(**batch)

    def timed_calls(self) -> dict:
        """The one timed call, counted in examples."""
        from headprune.tasks.base import TimedCall

        return {"forward": TimedCall(self.timed_call)}

    def memory_measures(self, model) -> dict[str, int]:
        """No per-model memory measure."""
        return {}

    def split_summary(self) -> dict[str, dict[str, int]]:
        """{split: {"examples": n}} of every split."""
        return {split: {"examples": int(n)} for split, n in self.split_sizes().items()}


class ClassifierSubsets:
    """Mixed into the classification tasks: device batches, split sizes, importance batches, per-example loss, evaluation, paired test."""

    IMPORTANCE_EXAMPLE = 2000
    sort_training = True  # training batches of examples of similar lengths (little padding)

    def _to_device(self, batch: dict) -> dict:
        return {k: v.to(self.model_device) for k, v in batch.items()}

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
        for batch in data.loader("importance", batch_size):
            batch.pop("idx")
            yield self._to_device(batch)

    def training_batches(self, examples: int, seed: int = 0) -> list[dict]:
        """``examples`` training examples drawn with ``seed``, in batches of the training batch size (``sort_training``: similar lengths, shuffled)."""
        data = self._require_data()
        train = data.dataset("train")
        length = (lambda i: train.lengths[i]) if self.sort_training else None
        batches = []
        for group in drawn_groups(len(train), examples, seed, int(data.config.batch_size), length):
            batch = data.collate([train[i] for i in group])
            batch.pop("idx")
            batches.append(self._to_device(batch))
        return batches

    def per_example_loss(self, batch: dict) -> torch.Tensor:
        """Cross-entropy of each example, shape (B,)."""
        return torch.nn.functional.cross_entropy(self(batch), batch["labels"], reduction="none")

    @torch.no_grad()
    def evaluate(self, mask=None, split: str = "eval", batch_size: int | None = None, on_batch=None) -> EvalResult:
        """Accuracy (percent) on ``split`` under ``mask``, per_example["correct"] in dataset order; ``on_batch(n)`` after each batch."""
        dataset = self._require_data().dataset(split)
        correct = torch.zeros(len(dataset), dtype=torch.long)
        with eval_mode(self.model), self.gates.masked(mask):  # no dropout: masked and pruned models give identical scores
            for batch in self._require_data().loader(split, batch_size):
                logits = self(self._to_device(batch))
                correct[batch["idx"]] = (logits.argmax(-1).cpu() == batch["labels"]).long()
                if on_batch is not None:
                    on_batch(len(batch["idx"]))
        n = len(dataset)
        return EvalResult(score=100.0 * int(correct.sum()) / max(n, 1), metric=self.metric, n=n, per_example={"correct": correct.tolist()})

    def evaluate_many(self, masks: list, split: str = "eval", on_batch=None, max_rows: int = 128) -> list[EvalResult]:
        """Scores of several masks, batched: many masks per forward pass, unchanged lower layers reused (headprune.engine.ablation)."""
        from headprune.engine.ablation import MaskBatcher

        if not masks:
            return []
        if not MaskBatcher.takes(self.gates):  # residual channels change every layer: one plain pass per mask
            return [self.evaluate(m, split, on_batch=on_batch if i == 0 else None) for i, m in enumerate(masks)]
        n = len(self._require_data().dataset(split))
        correct = torch.zeros(len(masks), n, dtype=torch.long)
        engine = MaskBatcher(self.model, self.gates, max_rows=max_rows)
        with eval_mode(self.model):
            for batch in self._require_data().loader(split):
                idx, labels = batch.pop("idx"), batch.pop("labels")
                logits = engine.logits(self._to_device(batch), masks)  # (M, B, C)
                correct[:, idx] = (logits.argmax(-1).cpu() == labels.unsqueeze(0)).long()
                if on_batch is not None:
                    on_batch(len(idx))
        return [
            EvalResult(score=100.0 * int(c.sum()) / max(n, 1), metric=self.metric, n=n, per_example={"correct": c.tolist()})
            for c in correct
        ]
