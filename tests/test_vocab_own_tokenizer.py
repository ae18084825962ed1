"""A vocabulary point is scored as it ships: the pruned model with its rewritten tokenizer on the same text, per byte."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from experiment_helpers import make_cfg, results

LM = ["data.tokenizer.vocab_size=300", "data.max_length=128"]  # BPE beyond the 256 bytes; no text cut by either tokenizer


def _prune(tmp_path, task: str, *overrides):
    """(config, results.json, the vocab point) of a prune run removing half the removable tokens, every point's model saved."""
    from hydra.utils import get_method

    from headprune.validation import validate

    torch.set_num_threads(1)
    extra = "prune.extra_splits=[heldout]" if task == "lm" else "prune.extra_splits=[eval_mismatched]"  # Pareto points: saved
    cfg = make_cfg(tmp_path, "prune", task, *overrides, "prune.unit=vocab", "prune.fractions=[0.5]", "prune.save=all", extra)
    validate(cfg)
    get_method(cfg.run)(cfg)
    payload = results(tmp_path)["results"]
    points = [p for p in payload["points"] if p["order"] != "unpruned"]
    assert len(points) == 1
    return cfg, payload, points[0]


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vocab_lm")
    return out, *_prune(out, "lm", *LM)


def test_lm_point_per_byte_loss_equals_the_saved_model_with_its_saved_tokenizer(lm_run):
    from transformers import AutoTokenizer

    from headprune.core.saving import load_pruned
    from headprune.tasks import registry
    from headprune.tasks.lm.data import LMData
    from headprune.tasks.lm.task import LanguageModelingTask

    out, cfg, payload, point = lm_run
    assert point["tokenizer"]["own"] is True and point["units_removed"] > 0
    folder = Path(out) / point["model_dir"]
    model, tokenizer = load_pruned(folder), AutoTokenizer.from_pretrained(folder)
    assert point["tokenizer"]["size"] == len(tokenizer) == model.config.vocab_size < 300
    texts = registry.load_task(cfg).data.texts["eval"]  # the evaluated texts, split directly by the saved tokenizer
    data = LMData({"eval": texts}, tokenizer, max_length=128, batch_size=8, eval_batch_size=8)
    direct = LanguageModelingTask(model, tokenizer, data).evaluate(split="eval")
    bits = point["bits_per_byte"]
    assert direct.measures["bits_per_byte"] == pytest.approx(bits, rel=1e-6)
    assert direct.score == pytest.approx(point["score"], rel=1e-6)  # per token of the new split: the same tokens
    assert point["tokenizer"]["data"]["predicted_tokens"] == sum(direct.per_example["tokens"])
    unpruned = next(p for p in payload["points"] if p["order"] == "unpruned")
    assert "tokenizer" not in unpruned and unpruned["bits_per_byte"] < 10  # bytes compare; a removed token costs no logit 0


def test_the_pruning_curve_scores_the_vocabulary_point_as_the_pareto_point_does(lm_run, tmp_path):
    from hydra.utils import get_method

    from headprune.validation import validate

    point = lm_run[3]
    cfg = make_cfg(tmp_path, "prune", "lm", *LM, "prune.unit=vocab", "prune.fractions=[0.5]")
    validate(cfg)
    get_method(cfg.run)(cfg)
    step = results(tmp_path)["results"]["orders"]["importance"]["steps"][0]
    assert step["tokenizer"] == point["tokenizer"] and step["mask"] == point["mask"]
    assert step["bits_per_byte"] == pytest.approx(point["bits_per_byte"], rel=1e-6)


def test_a_mask_that_removes_nothing_scores_as_the_unpruned_model(tmp_path):
    from headprune.core.units import unit_gates
    from headprune.stages.own_tokenizer import own_tokenizer_results, renumbers_ids
    from headprune.tasks import registry

    torch.set_num_threads(1)
    cfg = make_cfg(tmp_path, "prune", "lm", *LM, "prune.unit=vocab")
    task = registry.load_task(cfg)
    task.gates = unit_gates(task.model, "vocab")
    ones = task.gates.ones()
    assert not renumbers_ids(task, ones)
    base = task.evaluate(split="eval")
    own = own_tokenizer_results(task, task.model, ones, ["eval"], "all kept", progress=False)["eval"]  # the re-split path
    assert own.tokenizer["own"] is True and own.tokenizer["size"] == 300
    assert own.per_example["tokens"] == base.per_example["tokens"]
    assert own.score == pytest.approx(base.score, rel=1e-6)
    assert own.measures["bits_per_byte"] == pytest.approx(base.measures["bits_per_byte"], rel=1e-6)


def test_nli_point_is_scored_on_pairs_its_own_tokenizer_split(tmp_path):
    from transformers import AutoTokenizer

    from headprune.core.saving import load_pruned
    from headprune.tasks import registry

    cfg, payload, point = _prune(tmp_path, "nli")
    assert point["tokenizer"]["own"] is True
    folder = Path(tmp_path) / point["model_dir"]
    model, tokenizer = load_pruned(folder).eval(), AutoTokenizer.from_pretrained(folder)
    texts = registry.load_task(cfg)._require_data().dataset("eval").texts
    encoded = tokenizer(texts["premise"], texts["hypothesis"], padding=True, return_tensors="pt")
    with torch.no_grad():
        predicted = model(**encoded).logits.argmax(-1)
    correct = (predicted == torch.tensor(texts["label"])).long().tolist()
    assert correct == point["per_example"]["correct"]  # each pair, split directly by the saved tokenizer


def test_a_vocabulary_point_is_relative_per_byte_and_keeps_no_dead_row(lm_run, tmp_path):
    from hydra.utils import get_method

    from headprune.validation import validate

    _, _, payload, point = lm_run
    unpruned = next(p for p in payload["points"] if p["order"] == "unpruned")
    assert point["relative_by"] == "bits_per_byte" and "relative_by" not in unpruned
    assert point["relative"] == pytest.approx(point["bits_per_byte"] / unpruned["bits_per_byte"], rel=1e-9)
    assert point["relative"] != pytest.approx(point["score"] / unpruned["score"], rel=1e-3)  # per token: other tokens
    for split, extra in point["extra"].items():
        assert extra["relative_by"] == "bits_per_byte", split
    assert point["tokenizer"]["produced"] == point["tokenizer"]["size"]  # every kept token: some text still makes it
    cfg = make_cfg(tmp_path, "prune", "lm", *LM, "prune.unit=vocab", "prune.fractions=[0.5]")
    validate(cfg)
    get_method(cfg.run)(cfg)
    curve = results(tmp_path)["results"]
    step = curve["orders"]["importance"]["steps"][0]
    assert step["relative_by"] == "bits_per_byte"
    assert step["relative"] == pytest.approx(step["bits_per_byte"] / curve["base_bits_per_byte"], rel=1e-9)
