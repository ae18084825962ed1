"""A fine-tune of a cut vocabulary trains on the text it ships with: the training examples split into the tokens it keeps."""

from __future__ import annotations

import copy

import pytest
import torch
from experiment_helpers import make_cfg


@pytest.fixture(scope="module", params=[("nli", ()), ("lm", ("data.tokenizer.vocab_size=400",))], ids=["wordpiece", "bpe"])
def vocab_task(request, tmp_path_factory):
    torch.set_num_threads(1)
    from headprune.tasks import registry
    from headprune.tasks.unit_task import in_unit

    name, overrides = request.param
    return in_unit(registry.load_task(make_cfg(tmp_path_factory.mktemp("task"), "prune", name, *overrides)), "vocab")


def _cut(task, used: torch.Tensor):
    """A copy of the task's model without the lower-ranked half of its removable tokens (Fisher scores, floor kept; WordPiece: of
    those ``used``, as its synthetic text reads few of its 30k tokens), and the ids gone."""
    from omegaconf import OmegaConf

    from headprune.core.units import prune_unit_mask, unit_gates
    from headprune.sources.orders import ORDERS, OrderSettings, with_floor

    importance = OmegaConf.create({"reduce": "example", "normalize_layers": False, "normalize_global": False})
    settings = OrderSettings(importance=importance, seed=0, ablation_split=None, n_samples=None)
    scores = with_floor(task, ORDERS["fisher"].scores(task, settings))["vocab"][0]
    if task.tokenizer.backend_tokenizer.model.__class__.__name__ == "WordPiece":
        scores = torch.where(torch.isin(torch.arange(scores.numel()), used), scores, torch.inf)  # no merges: any token may go
    mask = {"vocab": torch.ones(1, scores.numel())}
    mask["vocab"][0, scores.argsort(stable=True)[: int(scores.isfinite().sum()) // 2]] = 0
    model = copy.deepcopy(task.model)
    prune_unit_mask(unit_gates(model, task.gates.unit), mask)
    return model, (mask["vocab"][0] == 0).nonzero().flatten()


def _ids(batches: list[dict]) -> torch.Tensor:
    return torch.cat([b["input_ids"].flatten() for b in batches])


def test_the_finetune_batches_of_a_cut_vocabulary_hold_no_removed_token(vocab_task):
    from headprune.stages.calibration_batches import kept_token_batches, kept_token_tuning, recovery_batches

    task = vocab_task
    drawn = task.training_batches(24, seed=3)
    model, removed = _cut(task, _ids(drawn))
    assert bool(torch.isin(_ids(drawn), removed).any())  # the training text used some removed tokens
    kept = kept_token_batches(task, model, recovery_batches(task, 8))
    tuning = kept_token_tuning(task, model, lambda _: task.training_batches(24, seed=3), drawn, kept)
    assert not bool(torch.isin(_ids(tuning), removed).any())  # drawn again from the split text: none
    assert sum(len(b["input_ids"]) for b in tuning) == sum(len(b["input_ids"]) for b in drawn)  # the same examples
    assert _ids(tuning).numel() >= _ids(drawn).numel() - 2 * len(drawn)  # a removed token is spelled with kept pieces
    assert kept_token_tuning(task, model, lambda _: drawn, None, kept) is None  # no fine-tune: nothing drawn
    unpruned = kept_token_tuning(task, task.model, lambda _: [], drawn, kept)
    assert unpruned is drawn  # every token kept: the batches as they are
