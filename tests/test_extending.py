"""Extending headprune as the README shows: a new task is one folder plus one registry line, touching no other file.

The toy task below is written to a temporary folder (its own package), registered with one ``TaskSpec`` line,
and then pruned and ablated by the unchanged experiments.
"""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from experiment_helpers import make_cfg

TOY_TASK = '''
"""A toy task: does the token 7 occur in a random sequence? A tiny BERT classifier, random weights."""
import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification

from headprune.core.attention.gates import HeadGates
from headprune.results.writer import texts_fingerprint
from headprune.scoring.significance import paired_bootstrap_accuracy
from headprune.tasks.base import EvalResult
from headprune.tasks.common import SharedTaskMethods


class ToyTask(SharedTaskMethods):
    name, metric, higher_is_better, paired_test_name = "toy", "accuracy", True, "paired bootstrap"
    selection_split = "importance"

    def __init__(self, seed: int):
        torch.manual_seed(seed)
        config = BertConfig(vocab_size=20, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32)
        self.model, self.tokenizer = BertForSequenceClassification(config).eval(), None
        self.gates = HeadGates(self.model)
        gen = torch.Generator().manual_seed(seed)
        ids = {s: torch.randint(0, 20, (n, 6), generator=gen) for s, n in (("eval", 32), ("importance", 16), ("train", 32))}
        self.data = {s: {"input_ids": x, "attention_mask": torch.ones_like(x), "labels": (x == 7).any(1).long()}
                     for s, x in ids.items()}

    def to(self, device):
        self.model.to(device)
        return self

    def split_sizes(self):
        return {s: len(b["labels"]) for s, b in self.data.items()}

    def data_fingerprint(self, split):
        return texts_fingerprint(map(str, self.data[split]["input_ids"].tolist()))

    def forward_batches(self, split):
        return [{k: v for k, v in self.data[split].items() if k != "labels"}]

    @torch.no_grad()
    def evaluate(self, mask=None, split="eval", on_batch=None):
        batch = self.data[split]
        with self.gates.masked(mask):
            correct = (self.model(**self.forward_batches(split)[0]).logits.argmax(-1) == batch["labels"]).long()
        if on_batch is not None:
            on_batch(len(correct))
        return EvalResult(100.0 * float(correct.float().mean()), "accuracy", len(correct), {"correct": correct.tolist()})

    def evaluate_many(self, masks, split="eval", on_batch=None):
        return [self.evaluate(m, split) for m in masks]

    def paired_test(self, baseline, systems, n_samples=1000, seed=0, alpha=0.01):
        return paired_bootstrap_accuracy(baseline.per_example["correct"], [s.per_example["correct"] for s in systems],
                                         n_samples=n_samples, seed=seed, alpha=alpha)

    def importance_batches(self):
        yield self.data["importance"]

    def training_batches(self, examples, seed=0):
        return [self.data["train"]]

    def per_example_loss(self, batch):
        logits = self.model(**{k: v for k, v in batch.items() if k != "labels"}).logits
        return F.cross_entropy(logits, batch["labels"], reduction="none")


def load_toy_task(cfg):
    return ToyTask(int(cfg.seed))


def check_toy(cfg, files=True, importance=True):
    """The toy task builds its data in memory: no setting or file of its own to check."""
'''


@pytest.fixture
def toy_registered(tmp_path, monkeypatch):
    """The toy task as its own folder on the path, and its one registry line."""
    from headprune.tasks import registry

    (tmp_path / "toytask").mkdir()
    (tmp_path / "toytask" / "__init__.py").write_text("")
    (tmp_path / "toytask" / "task.py").write_text(textwrap.dedent(TOY_TASK))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(
        registry.TASKS,
        "toy",
        registry.TaskSpec(
            "toy",
            None,
            "data=nli_synthetic",
            "toytask.task.load_toy_task",
            None,
            splits=("train", "importance", "eval"),
            check="toytask.task.check_toy",
            selection="importance",
        ),
    )
    yield
    sys.modules.pop("toytask.task", None)
    sys.modules.pop("toytask", None)


def _toy_cfg(tmp_path, experiment, *overrides):
    from omegaconf import open_dict

    cfg = make_cfg(tmp_path / "run", experiment, "nli", *overrides)
    with open_dict(cfg):
        cfg.model.kind = "toy"
    return cfg


def test_a_new_task_is_one_folder_and_one_registry_line(tmp_path, toy_registered):
    from headprune.experiments import ablate, prune
    from headprune.tasks.registry import load_task

    task = load_task(_toy_cfg(tmp_path, "prune"))
    assert type(task.task if hasattr(task, "task") else task).__name__ == "ToyTask"
    prune.run(_toy_cfg(tmp_path, "prune", "prune.order=[importance,fisher]", "prune.step=0.25"))
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["inputs"]["task"] == "toy" and set(results["results"]["orders"]) == {"importance", "fisher"}
    ablate.run(_toy_cfg(tmp_path, "ablate", "ablate.n_samples=50"))
    ablated = json.loads((tmp_path / "run" / "results.json").read_text())
    assert ablated["experiment"] == "ablate" and "enc_self" in json.dumps(ablated["results"])
