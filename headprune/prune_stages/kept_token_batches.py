"""Calibration text for a model whose vocabulary was cut: the same texts split again into the tokens it keeps.

A pruned vocabulary reads a removed id as a zeroed row, which the text it ships with never holds (its rewritten
tokenizer splits such a token into kept ones). Recovery fitted on that text (original ids, so the unpruned teacher
reads it too) sees the layer inputs the shipped model sees; the removed tokens then change no layer input at all.
"""

from headprune.export.renumbering import renumbering


def kept_token_batches(task, model, batches: list[dict]) -> list[dict]:
    """``batches`` (the first examples of the importance split) split again into the tokens the pruned ``model`` keeps, in
    original ids; as they are where it keeps every id or the task cannot split its examples again."""
    from headprune.prune_stages.pareto_measure import recovery_batches

    if getattr(task, "split_by", None) is None or getattr(task, "tokenizer", None) is None:
        return batches
    ids = renumbering(model, task.tokenizer)
    if ids.kept is None:
        return batches
    limit = getattr(model.config, "max_position_embeddings", None) or None  # more, shorter tokens: never past the positions

    def split_row(row, types=None):
        new, kinds = ids.split_again(task.tokenizer, row, types)
        return [ids.kept[t] for t in new][:limit], kinds if kinds is None else kinds[:limit]

    examples = sum(len(batch["input_ids"]) for batch in batches)
    with task.split_by(split_row, task.tokenizer, ["importance"]):
        return recovery_batches(task, examples)
