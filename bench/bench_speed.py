"""Throughput of MiniLM with 50% of heads physically pruned vs the original, beside the FLOP-ideal gain.

    .venv/bin/python bench/bench_speed.py [--fraction 0.5] [--batch-sizes 1 4 16 64] [--threads 2]

Target: at batch 64 the measured gain reaches >= 90% of the FLOP-ideal gain.
"""

from __future__ import annotations

import argparse

import torch
from common import ROOT, machine, minilm_task, parse_args


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument(
        "--clock",
        choices=["wall", "process"],
        default="wall",
        help="process: CPU seconds of this process (use with --threads 1 on a shared machine)",
    )
    parser.add_argument("--eval-examples", type=int, default=1000)
    args = parse_args(parser, smoke={"batch_sizes": [2], "examples": 4, "repeats": 1, "eval_examples": 16})
    torch.set_num_threads(args.threads)
    from omegaconf import OmegaConf

    from headprune.measures.speed_stage import speed_stage
    from headprune.selection.uniform import layout_masks
    from headprune.settings import SpeedSettings, read_settings
    from headprune.sources.orders import OrderSettings, order_scores

    task, data = minilm_task(args.eval_examples, ["data.importance_size=64"])
    importance = OmegaConf.create({"reduce": "example", "normalize_layers": True, "normalize_global": False})
    scores = order_scores(task, "importance", OrderSettings(importance, seed=0, ablation_split=None, n_samples=None))
    mask = layout_masks(scores, task.gates.groups, [args.fraction])[0]
    given = {"batch_sizes": args.batch_sizes, "examples": args.examples, "warmup": 2, "repeats": args.repeats, "clock": args.clock}
    given["max_seconds"] = 0.0  # no time budget: the benchmark times every repeat it asks for
    speed = OmegaConf.merge(OmegaConf.load(ROOT / "conf" / "speed" / "default.yaml"), given)
    result = speed_stage(task, mask, read_settings(SpeedSettings, speed, "speed"), 0)
    print(
        f"bench_speed: MiniLM, {result['units_removed']}/{result['units_total']} heads pruned, {data} eval inputs; {machine()}; clock={args.clock}"
    )
    print(f"score check (masked == pruned): {result['score_check']}")
    print(f"{'batch':>5s} {'len':>4s} {'original ex/s':>16s} {'pruned ex/s':>16s} {'gain':>7s} {'FLOP-ideal':>10s} {'gain/ideal':>10s}")
    for r in result["rows"]:
        o, p = r["original"], r["pruned"]
        print(
            f"{r['batch_size']:5d} {r['seq_len']:4d} {o['examples_per_s']:9.1f} +- {o['spread']:4.1f} {p['examples_per_s']:9.1f} +- {p['spread']:4.1f} "
            f"{100 * r['gain']:+6.1f}% {100 * r['flop_ideal_gain']:+9.1f}% {r['gain_vs_ideal']:10.2f}"
        )
    cost = result["cost"]
    print(
        f"parameters: {cost['original']['parameters']:,} -> {cost['pruned']['parameters']:,}; "
        f"attention FLOPs/example: {cost['original']['attention_flops']:,} -> {cost['pruned']['attention_flops']:,}"
    )


if __name__ == "__main__":
    main()
