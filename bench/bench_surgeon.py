"""The greedy structured surgeon (prune.order=obs / obs_fisher) on one FFN down projection: packed vs the textbook loop.

.venv/bin/python bench/bench_surgeon.py [--columns 1536] [--outputs 576] [--threads 1]

Both remove every input column greedily, each removal followed by the optimal update of the rest. The textbook loop
updates the whole (K, K) inverse and prices every column at every step; headprune's ``greedy_surgeon`` keeps the
columns still in packed at the front, so each step touches only their (n, n) block, in place. Same order, same errors.
"""

from __future__ import annotations

import argparse
import time

import torch
from common import machine, parse_args


def textbook(weight: torch.Tensor, gram: torch.Tensor, damp: float) -> list[tuple[int, float]]:
    """The greedy path with the full inverse updated after each removal and removed columns masked out of the prices."""
    w = weight.double().clone()  # (out, K)
    h = gram.double() + damp * float(gram.diagonal().mean()) * torch.eye(gram.shape[0], dtype=torch.float64)
    hinv, alive, order = torch.linalg.inv(h), torch.ones(w.shape[1], dtype=torch.bool), []
    for _ in range(w.shape[1]):
        costs = (w.square().sum(0) / hinv.diagonal()).masked_fill(~alive, float("inf"))  # ||w_c||^2 / (H^-1)_cc
        c = int(costs.argmin())
        order.append((c, float(costs[c])))
        w -= torch.outer(w[:, c], hinv[c]) / hinv[c, c]
        hinv -= torch.outer(hinv[:, c], hinv[c]) / hinv[c, c]
        alive[c] = False
    return order


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--columns", type=int, default=1536, help="input columns (FFN neurons): SmolLM2-135M has 1536")
    parser.add_argument("--outputs", type=int, default=576, help="output rows (the residual width)")
    parser.add_argument("--tokens", type=int, default=4096, help="calibration tokens behind the second moments")
    parser.add_argument("--threads", type=int, default=1)
    args = parse_args(parser, smoke={"columns": 48, "outputs": 16, "tokens": 256})
    torch.set_num_threads(args.threads)
    from headprune.scoring.obs import greedy_surgeon

    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.columns) @ torch.randn(args.columns, args.columns) / args.columns**0.5
    weight, gram = torch.randn(args.outputs, args.columns), (x.t() @ x).double()
    seconds, cpu, paths = {}, {}, {}
    for name, run in (
        ("textbook", lambda: textbook(weight, gram, 0.01)),
        ("packed", lambda: greedy_surgeon(weight, gram, [[c] for c in range(args.columns)], 0.01)),
    ):
        start, start_cpu = time.perf_counter(), time.process_time()
        paths[name] = run()
        seconds[name], cpu[name] = time.perf_counter() - start, time.process_time() - start_cpu
    same = [c for c, _ in paths["textbook"]] == [u for u, _ in paths["packed"]]
    print(f"bench_surgeon: greedy path over {args.columns} columns, {args.outputs} outputs, {args.tokens} tokens; {machine()}")
    print(f"{'':42s} {'wall s':>9s} {'cpu s':>9s}")
    print(f"{'textbook loop (full inverse each step)':42s} {seconds['textbook']:9.2f} {cpu['textbook']:9.2f}")
    print(f"{'packed (headprune greedy_surgeon)':42s} {seconds['packed']:9.2f} {cpu['packed']:9.2f}")
    ratio = f"{seconds['textbook'] / seconds['packed']:9.1f}x {cpu['textbook'] / cpu['packed']:8.1f}x"
    print(f"{'speed-up':42s} {ratio}   same order: {same}")


if __name__ == "__main__":
    main()
