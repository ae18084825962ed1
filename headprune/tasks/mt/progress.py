"""Progress inside a long beam search: each decoding step is reported as a share of its batch's sentences."""

import torch
from transformers import StoppingCriteria, StoppingCriteriaList


class _EachStep(StoppingCriteria):
    """A stopping criterion that never stops generation: it calls ``on_step()`` at every decoding step."""

    def __init__(self, on_step):
        self.on_step = on_step

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        self.on_step()
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


class BatchProgress:
    """``on_batch`` told of ``sentences`` in shares: one per decoding step of at most ``steps`` steps, the rest at ``done``."""

    def __init__(self, on_batch, sentences: int, steps: int):
        self.on_batch, self.sentences, self.share, self.told = on_batch, sentences, sentences / max(steps, 1), 0.0

    def criteria(self) -> StoppingCriteriaList | None:
        """What ``generate`` gets as ``stopping_criteria`` (None without ``on_batch``)."""
        return None if self.on_batch is None else StoppingCriteriaList([_EachStep(self._step)])

    def _step(self) -> None:
        share = min(self.share, 0.99 * self.sentences - self.told)  # the last share waits for the batch's end
        if share > 0:
            self.told += share
            self.on_batch(share)

    def done(self) -> None:
        """The batch is scored: report what is left of its sentences."""
        if self.on_batch is not None:
            self.on_batch(self.sentences - self.told)
