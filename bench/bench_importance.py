"""Importance with exact per-example |dL/dxi| vs one plain forward+backward pass. Target ratio <= 1.3.

.venv/bin/python bench/bench_importance.py [--examples 256] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import machine, minilm_task, parse_args


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, smoke={"examples": 8, "repeats": 1})
    torch.set_num_threads(args.threads)
    from headprune.scoring.importance import importance_scores, per_example_loss

    task, data = minilm_task(50, [f"data.importance_size={args.examples}"])
    model = task.model
    batches = list(task.importance_batches())

    def plain():
        model.zero_grad(set_to_none=True)
        for batch in batches:
            per_example_loss(model(**batch), batch).sum().backward()

    def importance():
        importance_scores(model, task.gates, batches, reduce="example")

    plain(), importance()  # warm-up
    times = {"plain": [], "importance": []}
    for r in range(args.repeats):
        for name, fn in (("plain", plain), ("importance", importance)) if r % 2 == 0 else (("importance", importance), ("plain", plain)):
            start = (time.perf_counter(), time.process_time())
            fn()
            times[name].append((time.perf_counter() - start[0], time.process_time() - start[1]))
    med = {k: (statistics.median(t[0] for t in v), statistics.median(t[1] for t in v)) for k, v in times.items()}
    n = sum(b["input_ids"].shape[0] for b in batches)
    print(f"bench_importance: MiniLM on {n} {data} training examples ({len(batches)} batches); {machine()}")
    print(f"{'':40s} {'wall s':>9s} {'cpu s':>9s}")
    print(f"{'plain forward+backward (param grads)':40s} {med['plain'][0]:9.2f} {med['plain'][1]:9.2f}")
    print(f"{'importance, exact per-example |.|':40s} {med['importance'][0]:9.2f} {med['importance'][1]:9.2f}")
    print(f"{'ratio (target <= 1.30)':40s} {med['importance'][0] / med['plain'][0]:9.3f} {med['importance'][1] / med['plain'][1]:9.3f}")


if __name__ == "__main__":
    main()
