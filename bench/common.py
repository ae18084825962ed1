"""Shared set-up for the benchmarks: the embedded MiniLM on MNLI inputs (the local copy, else the synthetic set), an LLM on texts."""

from __future__ import annotations

import os
import platform
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def minilm_task(limit_eval: int = 400, extra=(), data: str | None = None):
    """The NLI task with MiniLM (3-way head) on MNLI dev_matched when ../shared/data/mnli exists, else synthetic NLI (or ``data``)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from headprune.tasks.registry import load_task

    data_dir = Path(os.environ.get("HEADPRUNE_DATA_DIR", ROOT.parent / "shared" / "data"))
    data = data or ("nli_local" if (data_dir / "mnli").exists() else "nli_synthetic")
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "experiment=ablate",
                "model=minilm",
                f"data={data}",
                f"data.limit_eval={limit_eval}",
                "logger=none",
                "device=cpu",
                *extra,
            ],
        )
    with open_dict(cfg):
        cfg.paths.data_dir = str(data_dir)
        cfg.paths.output_dir = tempfile.mkdtemp(prefix="headprune-bench-")
    torch.manual_seed(0)
    task = load_task(cfg)
    return task, data


def lm_task(model: str, data: str, texts: int):
    """The language-modelling task of ``model=...`` on ``data=...`` (the local copy of the data by default)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from headprune.tasks.lm.task import load_lm_task

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=[f"model={model}", f"data={data}", "logger=none"])
    with open_dict(cfg):
        cfg.paths.data_dir = os.environ.get("HEADPRUNE_DATA_DIR", str(ROOT.parent / "shared" / "data"))
        cfg.paths.output_dir = tempfile.mkdtemp(prefix="headprune-bench-")
        if cfg.data.source == "local":
            cfg.data.limits = {"eval": texts, "importance": texts, "heldout": 1}
    torch.manual_seed(0)
    return load_lm_task(cfg)


def machine() -> str:
    return (
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


def parse_args(parser, smoke: dict):
    """Parse the command line; ``--smoke`` replaces the defaults with ``smoke`` (tiny sizes: the suite runs every bench so)."""
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, seconds: checks that the benchmark runs")
    args = parser.parse_args()
    if args.smoke:
        given = {a.split("=")[0].lstrip("-").replace("-", "_") for a in sys.argv[1:] if a.startswith("--")}
        for key, value in smoke.items():
            if key not in given:
                setattr(args, key, value)
    return args
