"""The MT pipeline end to end: a small Marian learns the synthetic translation task (generous bound, ~2-3 CPU minutes)."""

from __future__ import annotations

import json

import pytest
import torch
from test_mt_task import mt_cfg

pytestmark = pytest.mark.slow  # trains a translation model

LEARNS = [
    "data.synthetic.sizes.train=4000",
    "data.synthetic.sizes.valid=100",
    "data.synthetic.sizes.test=100",
    "data.tokenizer.vocab_size=600",
    "data.max_tokens=1024",
    "model.config.d_model=128",
    "model.config.encoder_ffn_dim=256",
    "model.config.decoder_ffn_dim=256",
    "model.config.init_std=0.088",
    "optim.lr=1e-3",
    "scheduler.warmup_steps=150",
    "task.beam_size=2",
]


def test_small_model_learns_the_synthetic_task(tmp_path):
    from headprune.tasks.mt.task import train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        metrics = train(mt_cfg(tmp_path, "trainer.max_epochs=6", small=LEARNS))
    finally:
        torch.set_num_threads(threads)
    # mt_small with the default data=mt_synthetic reaches BLEU >= 90; this smaller, shorter run is a pipeline guard
    assert metrics["test/bleu"] >= 30, metrics
    assert metrics["val/bleu"] >= 30, metrics
    assert len(list((tmp_path / "checkpoints").glob("epoch*.ckpt"))) == 6
    assert json.loads((tmp_path / "results.json").read_text())["results"]["test/bleu"] == metrics["test/bleu"]
