"""experiment=mt_train under DDP (two CPU processes, gloo): sharded token batches, validation BLEU gathered by id."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # DDP over two processes

ROOT = Path(__file__).resolve().parents[1]


def test_mt_train_runs_under_ddp_cpu(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "headprune.cli",
        "experiment=mt_train",
        "model=tiny_marian",
        "trainer=ddp_cpu",
        "logger=none",
        "data.synthetic.sizes.train=300",
        "data.synthetic.sizes.valid=40",
        "data.synthetic.sizes.test=40",
        "data.tokenizer.vocab_size=200",
        "data.max_tokens=512",
        "task.beam_size=2",
        "trainer.max_epochs=2",
        "trainer.enable_progress_bar=false",
        f"hydra.run.dir={tmp_path}",
    ]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert results["epochs"] == 2 and "val/bleu" in results and "test/bleu" in results
    from headprune.models.tokenizers import encode, load_tokenizer
    from headprune.tasks.mt.data import token_batches
    from headprune.tasks.mt.synthetic import synthetic_splits

    tok = load_tokenizer(tmp_path / "tokenizer")
    src, tgt = synthetic_splits({"train": 300, "valid": 40, "test": 40})["train"]
    n_batches = len(token_batches([len(x) for x in encode(tok, src)], [len(x) for x in encode(tok, tgt, target=True)], 512, shuffle=True))
    assert results["global_step"] == 2 * (n_batches // 2)  # each of the 2 ranks took half of the batches per epoch
    assert sorted(p.name.split("-")[0] for p in (tmp_path / "checkpoints").glob("epoch*.ckpt")) == ["epoch000", "epoch001"]
