"""What the tasks share of the protocol in headprune.tasks.base: timing batches and the timed call."""

import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import torch
from torch.nn.utils.rnn import pad_sequence

from headprune.core.saving import save_pruned
from headprune.tasks.base import TimedCall


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


def padded(rows, value: int) -> torch.Tensor:
    """Token-id rows (lists or tuples of ints) right-padded with ``value`` into one (B, T) long tensor, T the longest row."""
    return pad_sequence([torch.as_tensor(row, dtype=torch.long) for row in rows], batch_first=True, padding_value=value)


def drawn_groups(count: int, examples: int, seed: int, size: int, length: Callable[[int], int] | None = None) -> list[list[int]]:
    """``examples`` of ``count`` rows drawn with ``seed`` in groups of ``size``; by ``length``: similar lengths, groups in a seeded order."""
    generator = torch.Generator().manual_seed(seed)
    chosen = torch.randperm(count, generator=generator)[: max(int(examples), 0)].tolist()
    if length is not None:
        chosen.sort(key=length)
    groups = [chosen[start : start + size] for start in range(0, len(chosen), size)]
    return groups if length is None else [groups[i] for i in torch.randperm(len(groups), generator=generator).tolist()]


class LazySizes(Mapping):
    """{split: examples} whose sizes are counted on first access (a large training split is read only when asked for)."""

    def __init__(self, splits, count: Callable[[str], int]):
        self._splits, self._count = list(splits), functools.cache(count)  # each split counted once

    def __getitem__(self, split: str) -> int:
        if split not in self._splits:
            raise KeyError(split)
        return self._count(split)

    def __iter__(self):
        return iter(self._splits)

    def __len__(self) -> int:
        return len(self._splits)

    def __repr__(self) -> str:
        return repr(dict(self))


class SharedTaskMethods:
    """Mixed into every task; a task provides ``forward_batches(split)`` (model inputs with targets, on the CPU)."""

    def save_hf(self, path) -> Path:
        """Write the model and its tokenizer to ``path`` (with the record of where the tokenizer came from, when known)."""
        from headprune.models.tokenizer_origin import keep_origin

        saved = save_pruned(self.model, path, tokenizer=self.tokenizer)
        keep_origin(self.tokenizer, path)
        return saved

    @property
    def model_device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _to_device(self, batch: dict) -> dict:
        """The batch on the model's device, its example indices (``ids``, ``idx``) left out."""
        return {k: v.to(self.model_device) for k, v in batch.items() if k not in ("ids", "idx")}

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
        return {"forward": TimedCall(self.timed_call)}

    def memory_measures(self, model) -> dict[str, int]:
        """No per-model memory measure."""
        return {}

    def split_summary(self) -> dict[str, dict[str, int]]:
        """{split: {"examples": n}} of every split."""
        return {split: {"examples": int(n)} for split, n in self.split_sizes().items()}
