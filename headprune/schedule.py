"""Iterative pruning: prune to 20%, recover, re-score the recovered model, prune to 40%, recover, ...

Generic: it needs a model, a per-example loss and training batches, not a task class. Heads are
removed physically at every step, so a recovery step (``recover(model, teacher, batches)``:
``recovery.lsq_recoverer`` or ``recovery_finetune.finetune_recoverer``) can never bring them back.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
from torch import nn

from headprune.heads import HeadGates
from headprune.importance import fisher_scores, per_example_loss
from headprune.ordering import check_fractions, check_groups, greedy_mask, n_to_prune, ranked_heads
from headprune.pruning import prune_mask


@dataclass
class PruneStep:
    """One step of a schedule: the fraction of the original heads pruned, the cumulative mask and the model after recovery."""

    fraction: float
    mask: dict[str, torch.Tensor]  # {group: 0/1 [layers, heads]} over the original heads
    scores: dict[str, torch.Tensor]  # the scores this step pruned by (estimated on the previous step's recovered model)
    model: nn.Module | None  # a copy of the pruned, recovered model (None with keep_models=False)


def _fisher(model, gates, batches, loss_fn):
    return fisher_scores(model, gates, batches, loss_fn=loss_fn)


def iterative_prune(model: nn.Module, schedule, batches: Iterable[dict], loss_fn: Callable = per_example_loss,
                    recover: Callable | None = None, score_fn: Callable = _fisher, min_per_layer: int = 0, groups=None,
                    teacher: nn.Module | None = None, keep_models: bool = True) -> list[PruneStep]:
    """Prune ``model`` in place to each fraction of ``schedule`` in turn, re-scoring and recovering after each step.

    ``score_fn(model, gates, batches, loss_fn) -> {group: [L, H]}`` (lower = pruned first; default Fisher);
    ``teacher`` is the unpruned reference for recovery (default: a copy of ``model`` before the first step).
    """
    fractions = check_fractions(schedule)
    if list(map(float, schedule)) != fractions:
        raise ValueError(f"a pruning schedule must grow step by step, e.g. [0.2, 0.4, 0.6]; got {list(schedule)}")
    batches = list(batches)
    teacher = copy.deepcopy(model).eval() if teacher is None else teacher
    steps = []
    for fraction in fractions:
        gates = HeadGates(model)
        shape = gates.groups
        chosen = check_groups(groups, shape)
        scores = score_fn(model, gates, batches, loss_fn)
        present = {g: p.float() for g, p in gates.present().items()}
        mask = greedy_mask(ranked_heads(scores, chosen), shape, n_to_prune(fraction, shape, chosen), min_per_layer, start=present)
        prune_mask(model, mask)
        if recover is not None:
            recover(model, teacher, batches)
        steps.append(PruneStep(fraction, mask, scores, copy.deepcopy(model) if keep_models else None))
    return steps
