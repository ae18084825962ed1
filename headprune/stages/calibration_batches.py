"""Calibration text for recovery: the first importance examples; for a cut vocabulary, split again into its kept tokens (as the
shipped tokenizer splits a removed one), so that recovery sees the layer inputs the shipped model sees."""

import torch

from headprune.export.renumbering import renumbering
from headprune.stages.own_tokenizer import row_splitter


def recovery_batches(task, examples: int) -> list[dict]:
    """The first ``examples`` training examples of the task's importance subset, as model-input batches."""
    out, seen = [], 0
    for batch in task.importance_batches():
        size = next(v for v in batch.values() if torch.is_tensor(v)).shape[0]
        keep = min(size, examples - seen)
        out.append(batch if keep == size else {k: v[:keep] if torch.is_tensor(v) and v.dim() else v for k, v in batch.items()})
        seen += keep
        if seen >= examples:
            break
    if not out:
        raise ValueError("recovery needs training examples, but the task's importance subset is empty")
    return out


def kept_token_splitter(task, model):
    """The splitter into the tokens the pruned ``model`` keeps (original ids); None where it keeps all or the task cannot split."""
    if getattr(task, "split_by", None) is None or getattr(task, "tokenizer", None) is None:
        return None
    ids = renumbering(model, task.tokenizer)
    return None if ids.kept is None else row_splitter(ids, task.tokenizer, model, original_ids=True)


def kept_token_batches(task, model, batches: list[dict]) -> list[dict]:
    """``batches`` (the first examples of the importance split) split again into the tokens the pruned ``model`` keeps, in
    original ids; as they are where it keeps every id or the task cannot split its examples again."""
    splitter = kept_token_splitter(task, model)
    if splitter is None:
        return batches
    examples = sum(len(batch["input_ids"]) for batch in batches)
    with task.split_by(splitter, task.tokenizer, ["importance"]):
        return recovery_batches(task, examples)


def kept_token_tuning(task, model, finetune_batches, tuning: list[dict] | None, kept: list[dict]) -> list[dict] | None:
    """The fine-tune's batches drawn again (``finetune_batches(kept)``) from training text split into the tokens the pruned
    ``model`` keeps, so it trains on the text it ships with; ``tuning`` as it is where it keeps every id."""
    splitter = kept_token_splitter(task, model) if tuning is not None else None
    if splitter is None:
        return tuning
    splits = [split for split in ("train", "importance") if split in task.split_sizes()]
    with task.split_by(splitter, task.tokenizer, splits):
        return finetune_batches(kept)
