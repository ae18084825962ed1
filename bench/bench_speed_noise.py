"""The speed verdict under a busy CPU: the same pruned/original pair timed quietly and beside spinning processes.

    .venv/bin/python bench/bench_speed_noise.py [--spinners 2] [--smoke]

A confident busy-CPU gain should agree in sign with the quiet one (or be marked inconclusive).
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys

import torch
from common import machine, parse_args


def models_and_batches(layers: int, heads: int, batch: int, length: int):
    """A random BERT and its twin with 6 of 8 heads pruned in every layer, and two input batches."""
    from transformers import BertConfig, BertModel

    from headprune.core.pruning import prune_mask

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=100,
        hidden_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=128,
        max_position_embeddings=64,
    )
    original = BertModel(config).eval()
    pruned = copy.deepcopy(original)
    mask = torch.ones(layers, heads)
    mask[:, : heads * 3 // 4] = 0
    prune_mask(pruned, {"enc_self": mask})
    gen = torch.Generator().manual_seed(0)
    batches = [
        {"input_ids": torch.randint(3, 100, (batch, length), generator=gen), "attention_mask": torch.ones(batch, length, dtype=torch.long)}
        for _ in range(2)
    ]
    calls = {name: (lambda b, m=m: m(**b)) for name, m in (("original", original), ("pruned", pruned))}
    return calls, batches


def measure(calls, batches, spinners: int, max_seconds: float) -> dict:
    """Gain, interval and verdict of one alternating timing, with ``spinners`` busy processes beside it."""
    from headprune.engine.timing import compare_throughput
    from headprune.engine.verdict import gain_summary, verdict

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(spinners)]
    try:
        with torch.no_grad():
            timing = compare_throughput(calls, batches, warmup=1, repeats=4, max_seconds=max_seconds, tolerance=0.02, max_repeats=400)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    summary = gain_summary(timing["original"]["seconds"], timing["pruned"]["seconds"])
    return {**summary, "verdict": verdict(summary)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--spinners", type=int, default=2)
    parser.add_argument("--max-seconds", type=float, default=3.0)
    args = parse_args(parser, smoke={"max_seconds": 0.3, "spinners": 0})
    sizes = (2, 8, 4, 16) if args.smoke else (4, 8, 16, 48)
    calls, batches = models_and_batches(*sizes)
    max_seconds = args.max_seconds
    print(f"bench_speed_noise: tiny BERT {sizes[0]} layers, 6 of 8 heads pruned per layer; {machine()}")
    for name, spinners in (("quiet", 0), ("busy", args.spinners)):
        r = measure(calls, batches, spinners, max_seconds)
        low, high = r["gain_interval"] if r["gain_interval"] else (float("nan"), float("nan"))
        print(
            f"{name:>5s} ({spinners} spinners): gain {100 * r['gain']:+.1f}% [{100 * low:+.1f}, {100 * high:+.1f}] "
            f"over {r['repeats']} repeats: {r['verdict']}"
        )


if __name__ == "__main__":
    main()
