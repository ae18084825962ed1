"""Every experiment on the MT task (tiny Marian, synthetic translation, greedy search): results, figures, groups."""

from __future__ import annotations

import copy

import pytest
import torch
from experiment_helpers import make_cfg, results, task_fixtures

from headprune.core.saving import load_pruned, save_pruned
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.experiments import ablate, keep_one, prune, speed, study
from headprune.export.renumbering import renumbering
from headprune.measures import evaluation
from headprune.models.tokenizers import load_tokenizer
from headprune.stages.own_tokenizer import own_tokenizer_results, row_splitter
from headprune.tasks.mt.data import TranslationDataModule, split_of
from headprune.tasks.mt.task import TranslationModule

TASK = "mt"


task, shared_task = task_fixtures(TASK)


def test_ablate_three_groups_with_sacrebleu_bootstrap(shared_task, tmp_path):
    ablate.run(make_cfg(tmp_path, "ablate", TASK))
    res = results(tmp_path)["results"]["splits"]["eval"]
    assert res["metric"] == "bleu" and res["bootstrap"]["test"].startswith("sacrebleu")
    assert set(res["per_group"]) == {"enc_self", "enc_dec", "dec_self"} and len(res["rows"]) == 24
    mask = shared_task.gates.ones()
    mask["enc_dec"][1, 3] = 0
    row = next(r for r in res["rows"] if (r["group"], r["layer"], r["head"]) == ("enc_dec", 1, 3))
    assert row["score"] == pytest.approx(shared_task.evaluate(mask).score)


def test_keep_one_selects_on_heldout(shared_task, tmp_path):
    keep_one.run(make_cfg(tmp_path, "keep_one", TASK, "keep_one.n_samples=100", "keep_one.groups=[enc_dec]"))
    res = results(tmp_path)["results"]
    assert res["selection_split"] == "heldout" and [r["group"] for r in res["rows"]] == ["enc_dec", "enc_dec"]


def test_prune_one_group(shared_task, tmp_path):
    prune.run(make_cfg(tmp_path, "prune", TASK, "prune.groups=[enc_dec]", "prune.step=0.25", "prune.order=[importance,random]"))
    res = results(tmp_path)["results"]
    assert res["groups"] == ["enc_dec"] and res["units_total"] == 8
    for steps in (res["orders"]["importance"]["steps"], res["orders"]["random"]["steps"]):
        assert [s["units_removed"] for s in steps] == [0, 2, 4, 6]
        assert all(sum(map(sum, s["mask"]["enc_self"])) == 8 for s in steps)  # other groups untouched


def test_speed(shared_task, tmp_path):
    speed.run(make_cfg(tmp_path, "speed", TASK, "speed.batch_sizes=[2]", "speed.examples=4", "speed.repeats=1", "speed.warmup=1"))
    res = results(tmp_path)["results"]
    assert res["score_check"]["equal"] and res["units_removed"] == 12
    assert [(r["call"], r["unit"]) for r in res["rows"]] == [("forward", "examples"), ("beam", "sentences")]  # beam timed last


@pytest.mark.slow
def test_study(tmp_path, monkeypatch):
    over = [
        "study.train=false",
        "study.n_samples=50",
        "prune.step=0.5",
        "prune.order=[importance,random]",
        "study.reestimate=false",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=1",
        "speed.warmup=1",
    ]
    study.run(make_cfg(tmp_path, "study", TASK, *over))
    payload = results(tmp_path)
    assert set(payload["results"]["prune"]["by_group"]) == {"enc_self", "enc_dec", "dec_self"}
    assert "prune_groups.png" in payload["figures"]


def test_evaluate_many_reports_every_batch(shared_task):
    """The progress callback sees each test sentence once per call."""
    from headprune.tasks.base import Task

    assert isinstance(shared_task, Task) and shared_task.name == TASK
    seen = []
    shared_task.evaluate_many([None, None], split="eval", on_batch=seen.append)
    assert sum(seen) == evaluation.split_size(shared_task, "eval")


@pytest.mark.slow
def test_study_on_t5(tmp_path):
    """A tiny T5 (relative position bias, three groups) through every stage of the study on synthetic MT data."""
    over = [
        "model=tiny_t5",
        "study.train=false",
        "study.n_samples=50",
        "prune.step=0.5",
        "prune.order=[importance,random]",
        "study.reestimate=false",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=1",
        "speed.warmup=1",
    ]
    study.run(make_cfg(tmp_path, "study", TASK, *over))
    payload = results(tmp_path)
    assert {"ablate", "keep_one", "prune", "speed"} <= set(payload["results"]), sorted(payload["results"])
    assert set(payload["results"]["prune"]["by_group"]) == {"enc_self", "enc_dec", "dec_self"}
    assert payload["config"]["model"]["name"] == "tiny_t5"


def test_prune_the_vocabulary_of_a_marian_model(shared_task, tmp_path):
    """prune.unit=vocab on a Marian model (its final_logits_bias beside the tied head): pruned translates as masked; the run's
    score is the saved model's, reading text split by its rewritten tokenizer."""
    over = ("prune.unit=vocab", "prune.order=importance", "prune.fractions=[0.3]", "prune.measure_speed=false")
    prune.run(make_cfg(tmp_path, "prune", TASK, *over))
    res = results(tmp_path)["results"]
    step = res["orders"]["importance"]["steps"][-1]
    assert res["unit"] == "vocab" and step["units_removed"] > 0
    mask = {"vocab": torch.tensor(step["mask"]["vocab"], dtype=torch.float32)}
    with unit_gates(shared_task.model, "vocab").masked(mask):
        masked = shared_task.evaluate(None)
    pruned = copy.deepcopy(shared_task.model)
    prune_unit_mask(unit_gates(pruned, "vocab"), mask)
    with evaluation.swapped_model(shared_task, pruned):  # the pruned model reads and writes original ids
        assert shared_task.evaluate(None).per_example["hypotheses"] == masked.per_example["hypotheses"]
    # the run scores the point as it ships: the saved model and its rewritten tokenizer, the sources tokenized afresh
    save_pruned(pruned, tmp_path / "saved", tokenizer=shared_task.tokenizer)
    tokenizer = load_tokenizer(tmp_path / "saved")
    assert len(tokenizer) < len(shared_task.tokenizer)
    data = TranslationDataModule(shared_task.data.cfg, tokenizer=tokenizer)
    data.texts = shared_task.data.texts  # the same sentences, split by the rewritten tokenizer
    shipped = TranslationModule(load_pruned(tmp_path / "saved").eval(), tokenizer, data, shared_task.task_cfg)
    with evaluation.swapped_model(shared_task, shared_task.model, unit_gates(shared_task.model, "vocab")):
        own = own_tokenizer_results(shared_task, shared_task.model, mask, ["eval"], "vocab", progress=False)["eval"]
    hypotheses = shipped.evaluate(None).per_example["hypotheses"]
    assert own.per_example["hypotheses"] == hypotheses and any(hypotheses)
    ids, split = renumbering(copy.deepcopy(pruned), shared_task.tokenizer), split_of(data.cfg, "eval")
    with shared_task.split_by(row_splitter(ids, shared_task.tokenizer, pruned), ids.tokenizer, ["eval"]):
        assert shared_task.data.split_encoded(split) == data.split_encoded(split)  # old ids split again == text tokenized afresh
    assert shared_task.data.split_encoded(split) != data.split_encoded(split)
    assert step["tokenizer"]["own"] and step["score"] == pytest.approx(own.score)


def test_t5_layers_fine_tuned_translate_with_a_shallower_encoder(tmp_path):
    """prune.unit=layer + finetune on T5: the score's beam search runs on the pruned model whichever stack lost a layer."""
    over = (
        "model=tiny_t5",
        "prune.unit=layer",
        "prune.order=importance",
        "prune.fractions=[0.34]",
        "prune.measure_speed=false",
        "prune.recover=finetune",
        "prune.finetune.max_steps=2",
    )
    prune.run(make_cfg(tmp_path, "prune", TASK, *over))
    point = next(p for p in results(tmp_path)["results"]["points"] if p["recovery"] == "finetune")
    assert point["units_by_kind"]["layer"]["removed"] == 1 and len(point["per_example"]["hypotheses"]) > 0
