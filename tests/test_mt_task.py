"""TranslationModule on a tiny Marian and the synthetic task: gates vs ungated, gated vs pruned, masks, save/reload."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch
from experiment_helpers import CONF, ROOT, training_cfg

SMALL = [
    "data.synthetic.sizes.train=300",
    "data.synthetic.sizes.valid=20",
    "data.synthetic.sizes.test=24",
    "data.tokenizer.vocab_size=200",
    "data.importance.size=16",
    "data.eval_batch_size=8",
    "task.beam_size=3",
]


def mt_cfg(tmp_path, *overrides, small=SMALL):
    """The real experiment config, shrunk: tiny Marian, a small synthetic set, no logger, output in tmp_path."""
    return training_cfg(tmp_path, "mt_train", "tiny_marian", small, *overrides)


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared CPU: one thread avoids OpenMP stalls (25x faster generation under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def task(one_thread, tmp_path_factory):
    from headprune.tasks.mt.task import load_translation_task

    module = load_translation_task(mt_cfg(tmp_path_factory.mktemp("task")))
    return module


def _some_mask(task):
    mask = task.gates.ones()
    mask["enc_self"][0, 1] = 0
    mask["enc_dec"][1, :] = 0  # a whole layer of cross-attention
    mask["dec_self"][0, 2:] = 0
    return mask


def test_three_gated_groups(task):
    assert task.metric == "bleu"
    assert task.gates.groups == {"enc_self": (2, 4), "enc_dec": (2, 4), "dec_self": (2, 4)}


def test_gates_at_one_translate_exactly_like_the_ungated_model(task):
    gated = task.translate(mask=task.gates.ones(), beam_size=3)
    ungated = copy.deepcopy(task)
    ungated.gates.remove()  # the model's own attention function again, no wrapper
    assert ungated.model.config._attn_implementation == "sdpa"
    assert ungated.translate(beam_size=3) == gated
    assert len(set(gated)) > 1


def test_pruned_model_translates_like_the_gated_model(task):
    from headprune.core.pruning import prune_mask

    mask = _some_mask(task)
    gated = task.translate(mask=mask, beam_size=3)
    assert gated != task.translate(beam_size=3)
    pruned = copy.deepcopy(task)
    prune_mask(pruned.model, mask)
    assert pruned.gates.present()["enc_dec"][1].sum() == 0
    assert pruned.translate(beam_size=3) == gated
    assert pruned.translate(beam_size=1) == task.translate(mask=mask, beam_size=1)


def test_evaluate_gives_corpus_bleu_and_bootstrap_statistics(task):
    from sacrebleu.metrics import BLEU

    result = task.evaluate()
    hyps, refs = result.per_example["hypotheses"], result.per_example["references"]
    assert result.metric == "bleu" and result.n == 24 == len(hyps) == len(refs)
    assert result.score == pytest.approx(BLEU().corpus_score(hyps, [refs]).score)
    stats = result.per_example["stats"]
    assert len(stats) == 24 and BLEU()._compute_score_from_stats([sum(c) for c in zip(*stats)]).score == pytest.approx(result.score)
    assert task.gates.sites[0].gate is None  # the mask is only in force inside evaluate


def test_evaluate_many_batches_masks_like_a_loop(task):
    masks = [None, _some_mask(task), task.gates.ones()]
    batched = task.evaluate_many(masks, beam_size=3)
    looped = [task.evaluate(m, beam_size=3) for m in masks]
    assert [r.per_example["hypotheses"] for r in batched] == [r.per_example["hypotheses"] for r in looped]
    assert [r.score for r in batched] == [r.score for r in looped]


def test_per_example_loss_matches_one_sentence_at_a_time(task):
    batch = task.importance_batches()[0]
    assert "labels" in batch and "ids" not in batch
    task.model.eval()
    with torch.no_grad():
        losses = task.per_example_loss(batch)
        assert losses.shape == (batch["input_ids"].shape[0],)
        for row in range(2):
            width = int(batch["attention_mask"][row].sum())
            length = int((batch["labels"][row] != -100).sum())
            one = {
                "input_ids": batch["input_ids"][row : row + 1, :width],
                "attention_mask": batch["attention_mask"][row : row + 1, :width],
                "decoder_input_ids": batch["decoder_input_ids"][row : row + 1, :length],
                "labels": batch["labels"][row : row + 1, :length],
            }
            hf_loss = task.model(**one).loss  # HF's own mean token cross-entropy
            torch.testing.assert_close(losses[row], hf_loss, atol=1e-5, rtol=1e-5)


def test_importance_batches_come_from_the_training_split(task):
    batches = task.importance_batches()
    assert sum(len(b["input_ids"]) for b in batches) == 16
    train_sources = set(task.data.split_texts("train")[0])
    from headprune.models.tokenizers import decode

    assert (
        set(
            decode(
                task.tokenizer, torch.cat([b["input_ids"] for b in batches if b["input_ids"].shape[1] == batches[0]["input_ids"].shape[1]])
            )
        )
        <= train_sources
    )


def test_inverse_sqrt_schedule():
    from headprune.tasks.mt.task import inverse_sqrt

    f = inverse_sqrt(4)
    assert [round(f(s), 3) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, round((4 / 5) ** 0.5, 3), round((4 / 6) ** 0.5, 3)]


@pytest.mark.slow
def test_train_save_and_reload_in_a_fresh_process_reproduces_bleu(tmp_path):
    from headprune.tasks.mt.task import train

    cfg = mt_cfg(tmp_path, "trainer.max_epochs=2")
    metrics = train(cfg)
    assert metrics["epochs"] == 2 and "val/bleu" in metrics and "test/bleu" in metrics
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["results"]["test/bleu"] == metrics["test/bleu"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt"))[:2] == [
        "epoch000-step" + p.name.split("step")[1] for p in sorted((tmp_path / "checkpoints").glob("epoch000*"))
    ] + ["epoch001-step" + p.name.split("step")[1] for p in sorted((tmp_path / "checkpoints").glob("epoch001*"))]
    code = (
        "import json, sys; from hydra import compose, initialize_config_dir\n"
        "from headprune.tasks.mt.task import load_translation_task\n"
        f"with initialize_config_dir(config_dir={CONF!r}, version_base='1.3'):\n"
        f"    cfg = compose('config', overrides={['experiment=mt_train', 'model=tiny_marian', *SMALL]!r} + ['model.pretrained=' + sys.argv[1], 'paths.output_dir=/tmp', 'paths.data_dir=/tmp'])\n"
        "task = load_translation_task(cfg)\n"
        "r = task.evaluate()\n"
        "print(json.dumps({'bleu': r.score, 'hyps': r.per_example['hypotheses']}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "model")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr[-2000:]
    reloaded = json.loads(out.stdout.strip().splitlines()[-1])
    saved = json.loads((tmp_path / "translations.test.json").read_text())
    assert reloaded["hyps"] == saved["hypotheses"]
    assert reloaded["bleu"] == metrics["test/bleu"]


@pytest.mark.slow
def test_checkpoint_reload_matches_the_saved_model(tmp_path):
    from headprune.tasks.mt.task import load_translation_task, train

    cfg = mt_cfg(tmp_path)
    train(cfg)
    ckpt = sorted((tmp_path / "checkpoints").glob("epoch000*.ckpt"))[0]
    from_ckpt = load_translation_task(mt_cfg(tmp_path, f"model.pretrained={ckpt}"))
    from_dir = load_translation_task(mt_cfg(tmp_path, f"model.pretrained={tmp_path / 'model'}"))
    assert from_ckpt.translate(beam_size=2) == from_dir.translate(beam_size=2)


def test_pretrained_dir_without_tokenizer_is_a_clear_error(tmp_path):
    from headprune.tasks.mt.task import load_translation_task

    (tmp_path / "bare").mkdir()
    (tmp_path / "bare" / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="comes without a tokenizer.*model.tokenizer"):
        load_translation_task(mt_cfg(tmp_path, f"model.pretrained={tmp_path / 'bare'}"))


def test_importance_scores_cover_all_three_groups(task):
    from headprune.scoring.importance import importance_scores

    scores = importance_scores(task.model, task.gates, task.importance_batches())
    assert {g: tuple(s.shape) for g, s in scores.items()} == {"enc_self": (2, 4), "enc_dec": (2, 4), "dec_self": (2, 4)}
    assert all(torch.isfinite(s).all() and (s > 0).any() for s in scores.values())
