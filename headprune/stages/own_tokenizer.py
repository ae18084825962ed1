"""A point that removes token ids is scored as it ships: physically pruned, ids renumbered, its text split again by its
rewritten tokenizer. Per-token scores then count other tokens; per byte of the same text (the LM's ``bits_per_byte``)
they compare with the unpruned model and with every other vocabulary."""

import copy

import torch

from headprune.core.unit_kinds import kinds_of
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.core.vocab.merges import produced_ids
from headprune.export.renumbering import renumbering
from headprune.measures.evaluation import evaluate_many, evaluate_one, swapped_model


def renumbers_ids(task, mask) -> bool:
    """Whether ``mask`` removes units of a kind whose pruned model reads and writes other token ids (the vocabulary)."""
    if mask is None:
        return False
    kinds = [kind for kind in kinds_of(task.gates.unit) if kind.renumbers_ids]
    return any(kind.owns(group) and bool((torch.as_tensor(value) == 0).any()) for kind in kinds for group, value in mask.items())


def row_splitter(ids, tokenizer, model, original_ids: bool = False):
    """``split_row(row, types)`` for ``task.split_by``: a row's text split again by the rewritten tokenizer of ``ids`` (its new ids,
    or the kept tokens' ``original_ids``), cut to ``model``'s positions."""
    limit = getattr(model.config, "max_position_embeddings", None) or None  # more, shorter tokens: never past the positions

    def split_row(row, types=None):
        new, kinds = ids.split_again(tokenizer, row, types)
        new = [ids.kept[t] for t in new] if original_ids else new
        return new[:limit], kinds if kinds is None else kinds[:limit]

    return split_row


def own_tokenizer_results(task, model, mask, splits: list[str], label: str, *, progress: bool) -> dict:
    """{split: EvalResult} of a copy of ``model`` pruned by ``mask`` (None: pruned already) reading and writing the renumbered ids
    (the saved model's), on each of ``splits`` split again by its rewritten tokenizer; each result's ``tokenizer`` says so."""
    if getattr(task, "split_by", None) is None:  # a task whose labels sit at token positions: scored as the mask gives it
        results = {split: evaluate_one(task, mask, split, label, progress=progress) for split in splits}
        for result in results.values():
            result.tokenizer = {"own": False, "why": f"the {task.name} task cannot split its examples again"}
        return results
    pruned = copy.deepcopy(model)
    if mask is not None:
        prune_unit_mask(unit_gates(pruned, task.gates.unit), mask)
    ids = renumbering(pruned, task.tokenizer)
    if ids.kept is None:  # a saved model loaded again (an earlier run's): it reads and writes its own ids already
        ids = renumbering(pruned, task.tokenizer, loaded=True)
    else:
        ids.apply(pruned)  # new ids in, logits over the kept ids only: a removed token takes no probability

    with task.split_by(row_splitter(ids, task.tokenizer, pruned), ids.tokenizer, splits), swapped_model(task, pruned):
        results = {split: evaluate_one(task, None, split, f"{label} own tokenizer", progress=progress) for split in splits}
        summary = task.split_summary()
    produced = len(produced_ids(ids.tokenizer))  # the kept ids some text still makes it produce (the rest: dead rows)
    compared = getattr(task, "across_tokenizers", None)  # per token counts other tokens: relative scores compare this
    for split, result in results.items():
        result.tokenizer = {"own": True, "size": len(ids.tokenizer), "produced": produced, "data": dict(summary.get(split, {}))}
        if compared in result.measures:
            result.tokenizer["compared_by"] = compared
    del pruned
    return results


def scored_masks(task, masks: list, split: str, desc: str, *, progress: bool) -> list:
    """The EvalResult of each mask on ``split``: one that removes token ids through its own tokenizer, the others batched."""
    own = {i for i, mask in enumerate(masks) if renumbers_ids(task, mask)}
    others = [mask for i, mask in enumerate(masks) if i not in own]
    rest = iter(evaluate_many(task, others, split, desc=desc, progress=progress) if others else [])
    return [
        own_tokenizer_results(task, task.model, mask, [split], f"{desc} #{i + 1}", progress=progress)[split] if i in own else next(rest)
        for i, mask in enumerate(masks)
    ]
