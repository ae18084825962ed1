"""Head gates at the attention function (the wrapper) vs at the output projection (a forward pre-hook), side by side.

Times, alternating the two mechanisms in one run on MiniLM: a masked forward pass, a forward pass with a
mask per example ([batch, layers, heads]: the batched ablation's layout) and importance from one backward
pass; prints each time and the ratio output / attention, and the largest difference of their results.

.venv/bin/python bench/bench_gate_mechanism.py [--examples 256] [--repeats 5] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import machine, minilm_task, parse_args

MECHANISMS = ("attention", "output")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    args = parse_args(parser, smoke={"examples": 8, "repeats": 1})
    torch.set_num_threads(args.threads)
    from headprune.core.attention.gates import HeadGates
    from headprune.core.inputs import model_inputs
    from headprune.scoring.importance import importance_scores

    task, data = minilm_task(50, [f"data.importance_size={args.examples}"])
    model = task.model
    batches = list(task.importance_batches())
    mask = HeadGates(model).ones()
    mask["enc_self"][::2, ::3] = 0  # a third of the heads of every other layer
    rows = max(b["input_ids"].shape[0] for b in batches)
    gen = torch.Generator().manual_seed(0)
    per_example = {"enc_self": (torch.rand(rows, *mask["enc_self"].shape, generator=gen) > 0.3).float()}

    def forward(mechanism, gate):
        g = HeadGates(model, gate_at=mechanism)  # the model's sites now gate there (a few attribute writes)
        outs = []
        with torch.inference_mode(), g.masked(gate):
            for batch in batches:
                n = batch["input_ids"].shape[0]
                g.set_mask({k: v[:n] for k, v in gate.items()} if gate is per_example else gate)
                outs.append(model(**model_inputs(model, batch)).logits)
        return torch.cat(outs)

    def importance(mechanism, _):
        return torch.cat([s.flatten() for s in importance_scores(model, HeadGates(model, gate_at=mechanism), batches).values()])

    cases = {"masked forward": (forward, mask), "per-example masks": (forward, per_example), "importance (1 backward)": (importance, None)}
    times = {(case, m): [] for case in cases for m in MECHANISMS}
    results = {}
    for case, (fn, gate) in cases.items():
        for m in MECHANISMS:
            results[case, m] = fn(m, gate)  # warm-up, and the results compared below
        for r in range(args.repeats):
            for m in MECHANISMS if r % 2 == 0 else MECHANISMS[::-1]:
                start = time.perf_counter()
                fn(m, gate)
                times[case, m].append(time.perf_counter() - start)
    n = sum(b["input_ids"].shape[0] for b in batches)
    print(f"bench_gate_mechanism: MiniLM on {n} {data} examples ({len(batches)} batches), {args.repeats} alternating repeats; {machine()}")
    print(f"{'median wall s':26s} {'attention fn':>13s} {'output hook':>13s} {'ratio':>7s} {'max |diff|':>11s}")
    for case in cases:
        a, o = (statistics.median(times[case, m]) for m in MECHANISMS)
        diff = (results[case, "output"] - results[case, "attention"]).abs().max().item()
        print(f"{case:26s} {a:13.3f} {o:13.3f} {o / a:7.3f} {diff:11.2e}")


if __name__ == "__main__":
    main()
