"""The unpruned model's passkey retrieval over context length: each prompt's exact match at each length, in one JSON.

    python tools/passkey_curve.py --lengths 2048 4096 --prompts 100 [--model smollm2] [--data passkey_repeat] --out docs/results/passkey_curve.json

Each length's prompts are those of ``data=<--data> data.context_lengths=[L] data.sizes.eval=N`` (the prompts a
streaming prune run at that length scores), evaluated once with every unit kept; an existing ``--out`` keeps the
lengths it holds and gains the new ones. docs/results_long_context.md's curve is rendered from it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def passkey_task(model: str, length: int, prompts: int, data: str = "passkey_local"):
    """The PasskeyTask of ``prompts`` evaluation prompts of ``length`` tokens (no other split)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from headprune.tasks.longctx.task import load_passkey_task

    sizes = f"data.sizes={{eval:{prompts},importance:0,heldout:0,train:0}}"
    overrides = [f"model={model}", f"data={data}", f"data.context_lengths=[{length}]", sizes, "logger=none"]
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.data_dir = os.environ.get("HEADPRUNE_DATA_DIR", str(ROOT.parent / "shared" / "data"))
    return load_passkey_task(cfg)


def measure(model: str, length: int, prompts: int, data: str = "passkey_local") -> dict:
    """{"n", "score" (exact match, %), "correct" (0/1 per prompt), "seconds"} of the unpruned model at ``length``."""
    task = passkey_task(model, length, prompts, data)
    start = time.perf_counter()
    result = task.evaluate(None, split="eval")
    seconds = time.perf_counter() - start
    return {"n": result.n, "score": result.score, "correct": result.per_example["correct"], "seconds": round(seconds, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", required=True, help="context lengths in tokens")
    parser.add_argument("--prompts", type=int, default=100, help="prompts per length")
    parser.add_argument("--model", default="smollm2")
    passkey_data = sorted(path.stem for path in (ROOT / "conf" / "data").glob("passkey_*.yaml"))
    parser.add_argument("--data", default="passkey_local", choices=passkey_data, help="the passkey data config (conf/data/)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.prompts < 1 or min(args.lengths) < 1 or len(set(args.lengths)) < len(args.lengths):
        parser.error(f"--prompts and --lengths take positive numbers, each length once: got {args.prompts}, {args.lengths}")
    found = json.loads(args.out.read_text()) if args.out.is_file() else {"model": args.model, "data": args.data, "lengths": {}}
    if (found["model"], found["data"]) != (args.model, args.data):
        parser.error(
            f"{args.out} holds the curve of {found['model']} on {found['data']}, not {args.model} on {args.data}: write another --out"
        )
    for length in args.lengths:
        row = found["lengths"][str(length)] = measure(args.model, length, args.prompts, args.data)
        print(f"{length} tokens: {row['score']:.1f}% of {row['n']} prompts in {row['seconds']:.0f} s", flush=True)
        args.out.write_text(json.dumps(found, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
