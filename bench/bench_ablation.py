"""Single-head ablation of all heads vs (number of heads x one plain evaluation pass). Target ratio <= 0.5.

    .venv/bin/python bench/bench_ablation.py [--examples 400] [--threads 1]
    .venv/bin/python bench/bench_ablation.py --model smollm2 --texts 32 [--units head kv_group] [--threads 1]
    .venv/bin/python bench/bench_ablation.py --model tiny_llama --data lm_synthetic --texts 16  # a quick check

Same model, data and machine in one run: the plain evaluation (task.evaluate, no mask) is timed
before and after the ablation, and the ratio uses their median. Both wall-clock and process CPU time
are printed (CPU time is steadier when other jobs share the machine). MiniLM: ``task.evaluate_many``
of all single-head masks at once. An LLM: the ablation as experiment=ablate runs it
(``headprune.measures.evaluation.evaluate_many``, 36 masks per call), for each pruning unit of
``--units`` (query heads; KV groups, each a KV head with its query heads).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from common import lm_task, machine, minilm_task, parse_args


def clock():
    return time.perf_counter(), time.process_time()


def since(start):
    wall, cpu = clock()
    return wall - start[0], cpu - start[1]


def timed_plain(task, times: int) -> list:
    out = []
    for _ in range(times):
        start = clock()
        task.evaluate(None)
        out.append(since(start))
    return out


def report(title: str, plain: list, n: int, ablation, unit: str = "heads") -> None:
    wall = statistics.median(p[0] for p in plain)
    cpu = statistics.median(p[1] for p in plain)
    print(title)
    print(f"{'':32s} {'wall s':>9s} {'cpu s':>9s}")
    print(f"{'one plain evaluation':32s} {wall:9.2f} {cpu:9.2f}")
    print(f"{unit + ' x plain evaluation':32s} {n * wall:9.2f} {n * cpu:9.2f}")
    print(f"{'batched ablation, all ' + unit:32s} {ablation[0]:9.2f} {ablation[1]:9.2f}")
    print(f"{'ratio (target <= 0.50)':32s} {ablation[0] / (n * wall):9.3f} {ablation[1] / (n * cpu):9.3f}")


def minilm(args) -> None:
    from headprune.engine.ablation import single_unit_masks

    task, data = minilm_task(args.examples)
    masks, _ = single_unit_masks(task.gates.groups)
    task.evaluate(None)  # warm-up
    plain = timed_plain(task, 2)
    start = clock()
    batched = task.evaluate_many(masks)
    ablation = since(start)
    plain += timed_plain(task, 2)
    # spot check: the batched scores equal separate evaluations
    for i in (0, len(masks) // 2, len(masks) - 1):
        assert batched[i].per_example["correct"] == task.evaluate(masks[i]).per_example["correct"], f"mask {i} differs"
    report(f"bench_ablation: MiniLM ({len(masks)} heads) on {batched[0].n} {data} eval examples; {machine()}", plain, len(masks), ablation)


def llm(args) -> None:
    from headprune.engine.ablation import single_unit_masks
    from headprune.measures.evaluation import evaluate_many
    from headprune.tasks.unit_task import in_unit

    task = lm_task(args.model, args.data, args.texts)
    batches = task.data.batches("eval")
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    padded = sum(b["attention_mask"].numel() for b in batches)
    task.evaluate(None)  # warm-up
    plain = timed_plain(task, 2)
    runs = {}
    for unit in args.units:
        unit_task = in_unit(task, unit)
        masks, _ = single_unit_masks(unit_task.gates.groups)
        start = clock()
        batched = evaluate_many(unit_task, masks, "eval", progress=False)
        runs[unit] = (unit_task, masks, batched, since(start))
    plain += timed_plain(task, 2)
    worst = 0.0
    for unit_task, masks, batched, _ in runs.values():  # spot check: the batched NLLs equal separate evaluations
        for i in (0, len(masks) // 2, len(masks) - 1):
            alone = np.array(unit_task.evaluate(masks[i]).per_example["nll"])
            together = np.array(batched[i].per_example["nll"])
            np.testing.assert_allclose(together, alone, rtol=1e-4, atol=1e-4, err_msg=f"mask {i} differs")
            worst = max(worst, float(np.abs(together - alone).max()))
    print(
        f"bench_ablation: {args.model} on {len(task.data.split('eval'))} {args.data} eval texts in {len(batches)} batches "
        f"({real} real tokens of {padded} padded positions, {100 * real / padded:.0f}%); {machine()}"
    )
    print(f"spot check: per-text NLL of 3 masks per unit equals a separate evaluation (max abs difference {worst:.1e})")
    for unit, (_, masks, _, ablation) in runs.items():
        report(f"unit {unit}: {len(masks)} masks", plain, len(masks), ablation, "heads" if unit == "head" else "KV groups")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="minilm", help="minilm (NLI) or a causal LM config: smollm2, tiny_llama")
    parser.add_argument("--examples", type=int, default=400, help="MiniLM: evaluation examples")
    parser.add_argument("--texts", type=int, default=32, help="an LLM: evaluation texts")
    parser.add_argument("--data", default="lm_local", help="an LLM: the data config")
    parser.add_argument("--units", nargs="+", default=["head", "kv_group"], help="an LLM: pruning units to ablate")
    parser.add_argument("--threads", type=int, default=1)
    args = parse_args(parser, smoke={"examples": 8, "units": ["head"], "texts": 4, "model": "minilm"})
    torch.set_num_threads(args.threads)
    minilm(args) if args.model == "minilm" else llm(args)


if __name__ == "__main__":
    main()
