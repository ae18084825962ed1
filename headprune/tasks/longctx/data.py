"""Passkey examples per split as model batches: the answer teacher-forced, only its tokens labelled."""

import torch

from headprune.tasks.common import padded
from headprune.tasks.lm.data import SplitRows
from headprune.tasks.longctx.examples import PasskeyExample


def collate(examples: list[PasskeyExample], pad_id: int, copies: bool = False) -> dict[str, torch.Tensor]:
    """Right-padded inputs (B, T) without the last answer token, ``labels`` (B, T) the answer tokens; ``copies`` adds the needle spans."""
    input_ids = padded([e.ids[:-1] for e in examples], pad_id)  # (B, T)
    attention_mask = padded([[1] * (len(e.ids) - 1) for e in examples], 0)
    labels = padded([[-100] * (e.answer_start - 1) + list(e.answer) for e in examples], -100)  # from the position before the answer
    start, end = torch.full_like(input_ids, -1), torch.full_like(input_ids, -1)
    for row, e in enumerate(examples):
        first = e.answer_start - 1  # the position that predicts the first answer token
        for t, needle in enumerate(e.copies):
            if needle >= 0:
                start[row, first + t], end[row, first + t] = e.needles[needle]
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    return {**batch, "needle_start": start, "needle_end": end} if copies else batch


class PasskeyData(SplitRows):
    """The examples of each split and their batches (longest first; ``idx`` = each row's position in the split)."""

    what = "passkey"

    def __init__(self, examples: dict[str, list[PasskeyExample]], pad_id: int, batch_size: int, eval_batch_size: int):
        self.rows = examples
        self.pad_id = int(pad_id)
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)

    def collate_rows(self, examples: list[PasskeyExample], copies: bool = False) -> dict[str, torch.Tensor]:
        """One batch of examples (answer labels; ``copies``: each answer token's needle span)."""
        return collate(examples, self.pad_id, copies)

    def fingerprint_texts(self, split: str) -> list[str]:
        """Each example as text for a data fingerprint: its answer start and ids."""
        return [f"{e.answer_start}:{','.join(map(str, e.ids))}" for e in self.split(split)]

    def split_summary(self) -> dict[str, dict[str, int]]:
        """{split: {"examples", "tokens" (prompts, BOS included), "answer_tokens"}}."""
        return {
            split: {
                "examples": len(examples),
                "tokens": sum(e.answer_start for e in examples),
                "answer_tokens": sum(len(e.answer) for e in examples),
            }
            for split, examples in self.rows.items()
        }
