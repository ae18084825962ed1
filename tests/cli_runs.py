"""The command line run in this process: ``headprune overrides...`` into a run directory, its exit status and stderr."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from headprune import cli

TINY_LM_PRUNE = [  # experiment=prune on a tiny random Llama and small synthetic LM data, no logger
    "model=tiny_llama",
    "data=lm_synthetic",
    "data.synthetic.sizes.eval=16",
    "data.synthetic.sizes.importance=16",
    "data.synthetic.sizes.heldout=8",
    "data.tokenizer.vocab_size=200",
    "logger=none",
    "experiment=prune",
]


def headprune(capsys, monkeypatch, tmp_path: Path, run_dir: Path, *overrides: str) -> tuple[int, str]:
    """Run ``headprune overrides...`` into ``run_dir`` (data cache in ``tmp_path``): (exit status, stderr)."""
    capsys.readouterr()
    argv = ["headprune", *overrides, f"hydra.run.dir={run_dir}", f"paths.data_dir={tmp_path / 'data'}"]
    monkeypatch.setattr(sys, "argv", argv)
    torch.set_num_threads(1)
    try:
        cli.main()
        status = 0
    except SystemExit as done:
        status = done.code or 0
    return status, capsys.readouterr().err
