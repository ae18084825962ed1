"""Single-head ablation of all heads vs (number of heads x one plain evaluation pass). Target ratio <= 0.5.

    .venv/bin/python bench/bench_ablation.py [--examples 400] [--threads 1]

Same model, data and machine in one run: the plain evaluation (task.evaluate, no mask) is timed
before and after the ablation, and the ratio uses their median. Both wall-clock and process CPU time
are printed (CPU time is steadier when other jobs share the machine).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from common import machine, minilm_task


def clock():
    return time.perf_counter(), time.process_time()


def since(start):
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=400)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from headprune.ablation import single_head_masks

    task, data = minilm_task(args.examples)
    masks, _ = single_head_masks(task.gates.groups)
    task.evaluate(None)  # warm-up
    plain = []
    for _ in range(2):
        start = clock()
        base = task.evaluate(None)
        plain.append(since(start))
    start = clock()
    batched = task.evaluate_many(masks)
    ablation = since(start)
    for _ in range(2):
        start = clock()
        task.evaluate(None)
        plain.append(since(start))
    # spot check: the batched scores equal separate evaluations
    for i in (0, len(masks) // 2, len(masks) - 1):
        assert batched[i].per_example["correct"] == task.evaluate(masks[i]).per_example["correct"], f"mask {i} differs"
    wall = statistics.median(p[0] for p in plain)
    cpu = statistics.median(p[1] for p in plain)
    n = len(masks)
    print(f"bench_ablation: MiniLM ({n} heads) on {base.n} {data} eval examples; {machine()}")
    print(f"{'':28s} {'wall s':>9s} {'cpu s':>9s}")
    print(f"{'one plain evaluation':28s} {wall:9.2f} {cpu:9.2f}")
    print(f"{'heads x plain evaluation':28s} {n * wall:9.2f} {n * cpu:9.2f}")
    print(f"{'batched ablation, all heads':28s} {ablation[0]:9.2f} {ablation[1]:9.2f}")
    print(f"{'ratio (target <= 0.50)':28s} {ablation[0] / (n * wall):9.3f} {ablation[1] / (n * cpu):9.3f}")


if __name__ == "__main__":
    main()
