"""NLIModule on a tiny BERT and the synthetic set: evaluation under masks, importance batches, fit/save/load, resume, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import lightning as L
import pytest
import torch
from experiment_helpers import CONF, ROOT, training_cfg
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

SMALL = [
    "data=nli_synthetic",
    "data.synthetic.train_size=240",
    "data.synthetic.eval_size=60",
    "data.synthetic.mismatched_size=30",
    "data.importance_size=20",
    "data.batch_size=16",
]


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread: these models are tiny, and on a shared 2-core machine more threads only contend."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def nli_cfg(tmp_path, *overrides):
    """The real experiment config, shrunk: tiny BERT, a small synthetic set, no logger, output in tmp_path."""
    return training_cfg(tmp_path, "nli_finetune", "tiny_bert", SMALL, *overrides)


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from headprune.tasks.nli.task import load_nli_task

    torch.manual_seed(0)
    return load_nli_task(nli_cfg(tmp_path_factory.mktemp("task")))


def test_evaluate_under_masks_and_pruning(task):
    from headprune.core.pruning import prune_mask

    base = task.evaluate()
    assert base.metric == "accuracy" and base.n == 60 and len(base.per_example["correct"]) == 60
    assert base.score == pytest.approx(100 * sum(base.per_example["correct"]) / 60)
    assert task.evaluate(task.gates.ones()).per_example == base.per_example
    mask = task.gates.ones()
    mask["enc_self"][0, 1] = 0
    mask["enc_self"][1, :3] = 0
    masked = task.evaluate(mask)
    logits_masked = _logits(task, mask)
    assert not torch.equal(logits_masked, _logits(task, None))
    assert task.gates.sites[0].gate is None  # the mask is only in force inside evaluate
    assert [r.per_example for r in task.evaluate_many([None, mask])] == [base.per_example, masked.per_example]
    import copy

    pruned = copy.deepcopy(task)
    prune_mask(pruned.model, mask)
    torch.testing.assert_close(_logits(pruned, None), logits_masked, atol=1e-5, rtol=1e-5)
    assert pruned.evaluate().per_example == masked.per_example


def _logits(task, mask):
    batch = next(iter(task.data.loader("eval")))
    with torch.no_grad(), task.gates.masked(mask):
        return task(batch)


def test_importance_batches_are_the_training_subset(task):
    batches = list(task.importance_batches())
    assert sum(len(b["labels"]) for b in batches) == 20
    assert all("idx" not in b and "labels" in b for b in batches)
    imp = set(zip(task.data.datasets["importance"].texts["premise"], task.data.datasets["importance"].texts["hypothesis"]))
    ev = set(zip(task.data.datasets["eval"].texts["premise"], task.data.datasets["eval"].texts["hypothesis"]))
    assert not imp & ev
    losses = task.per_example_loss(batches[0])
    assert losses.shape == (len(batches[0]["labels"]),)
    out = task.model(**batches[0])
    torch.testing.assert_close(losses.mean(), out.loss)


@pytest.mark.slow
def test_finetune_save_and_reload_in_fresh_process(tmp_path):
    from headprune.tasks.nli.task import finetune

    cfg = nli_cfg(tmp_path, "trainer.max_epochs=2", "task.lr=1e-3")
    metrics = finetune(cfg)
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert results["train_examples"] == 220 and results["global_step"] == 2 * 14
    assert results["eval/correct"] == round(results["eval/accuracy"] * 60)  # Lightning's metric and evaluate() agree
    assert (tmp_path / "checkpoints" / "last.ckpt").exists() and (tmp_path / "model" / "config.json").exists()
    code = (
        "import json, sys; sys.argv = sys.argv[:1]; sys.path.insert(0, 'tests')\n"
        "from test_nli_task import nli_cfg\nfrom headprune.tasks.nli.task import load_nli_task\n"
        "from omegaconf import open_dict\nfrom pathlib import Path\n"
        f"cfg = nli_cfg(Path({str(tmp_path / 'fresh')!r}), 'model.pretrained={tmp_path / 'model'}')\n"
        "t = load_nli_task(cfg)\n"
        "print(json.dumps({s: t.evaluate(split=s).per_example['correct'] for s in t.eval_splits}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert out.returncode == 0, out.stderr[-3000:]
    fresh = json.loads(out.stdout.strip().splitlines()[-1])
    assert sum(fresh["eval"]) == results["eval/correct"] and sum(fresh["eval_mismatched"]) == results["eval_mismatched/correct"]
    assert metrics["objective"] == pytest.approx(100 * sum(fresh["eval"]) / 60, abs=0)


class CrashAt(L.Callback):
    """Simulate a crash in the middle of an epoch."""

    def __init__(self, epoch: int, batch: int):
        self.epoch, self.batch = epoch, batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.current_epoch == self.epoch and batch_idx == self.batch:
            raise RuntimeError("simulated crash")


NO_DROPOUT = ["+model.config.hidden_dropout_prob=0", "+model.config.attention_probs_dropout_prob=0"]


@pytest.mark.slow
def test_resume_after_interruption_matches_uninterrupted_run(tmp_path, monkeypatch):
    from headprune.lightning import trainer as training
    from headprune.tasks.nli.task import finetune

    straight = finetune(nli_cfg(tmp_path / "straight", "trainer.max_epochs=2", *NO_DROPOUT))
    original_fit = training.fit
    monkeypatch.setattr(training, "fit", lambda cfg, module, data, callbacks=(): original_fit(cfg, module, data, [CrashAt(1, 5)]))
    with pytest.raises(RuntimeError, match="simulated crash"):
        finetune(nli_cfg(tmp_path / "resumed", "trainer.max_epochs=2", *NO_DROPOUT))
    monkeypatch.setattr(training, "fit", original_fit)
    assert (tmp_path / "resumed" / "checkpoints" / "last.ckpt").exists()  # written at the end of epoch 0
    resumed = finetune(nli_cfg(tmp_path / "resumed", "trainer.max_epochs=2", "ckpt_path=last", *NO_DROPOUT))
    assert resumed["global_step"] == straight["global_step"] == 28  # went on from epoch 1, not from scratch
    a = torch.load(tmp_path / "straight" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    b = torch.load(tmp_path / "resumed" / "checkpoints" / "last.ckpt", weights_only=False)["state_dict"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], msg=key)  # same data order, optimizer and schedule state


@pytest.mark.parametrize(
    "override, error, message",
    [
        (["task.lr=fast"], ValueError, "task.lr, task.weight_decay and task.warmup_ratio must be numbers"),
        (["+task.learning_rate=1e-4"], ValueError, r"unknown task setting\(s\) \['learning_rate'\]"),
        (["data.source=web"], ValueError, "data.source='web' is not one of"),
        (["data.batch_size=0"], ValueError, "data.batch_size must be a positive integer"),
        (["model.pretrained=/no/such/model"], FileNotFoundError, "model.pretrained=/no/such/model does not exist"),
        (
            ["data.source=local", "data.dir=/no/such/dir"],
            FileNotFoundError,
            r"no file for the 'train' split: looked for train.jsonl.*does not exist",
        ),
    ],
)
def test_bad_overrides_give_clear_errors(tmp_path, override, error, message):
    from headprune.tasks.nli.task import load_nli_task

    with pytest.raises(error, match=message):
        load_nli_task(nli_cfg(tmp_path, *override))


def test_no_data_and_unbounded_schedule_errors(tmp_path):
    from headprune.tasks.nli.task import finetune, load_nli_task

    cfg = nli_cfg(tmp_path)
    with open_dict(cfg):
        cfg.data = None
    with pytest.raises(ValueError, match="no data chosen: add data=nli_local"):
        load_nli_task(cfg)
    with pytest.raises(ValueError, match="set trainer.max_epochs or trainer.max_steps"):
        finetune(nli_cfg(tmp_path, "trainer.max_epochs=-1"))


def test_experiment_composes_with_local_mnli_default():
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose(
            "config", overrides=["experiment=nli_finetune", "trainer.max_epochs=1", "data.limit_train=20000"], return_hydra_config=True
        )
    assert cfg.data.source == "local" and cfg.data.limit_train == 20000 and cfg.trainer.max_epochs == 1
    assert cfg.model.name == "minilm" and cfg.logger.kind == "wandb" and cfg.run == "headprune.experiments.nli_finetune.run"
    from omegaconf import OmegaConf

    assert OmegaConf.to_container(cfg.data)["dir"] == "${paths.data_dir}/mnli"  # ../shared/data/mnli unless overridden
