"""A distilled recovery fine-tune in bf16-mixed vs 32-true: real tokens per second, side by side on the same batches.

    .venv/bin/python bench/bench_finetune_precision.py                       # SmolLM2-135M on data=lm_wide, 2 threads
    .venv/bin/python bench/bench_finetune_precision.py --model tiny_llama --data lm_synthetic

Each round fine-tunes a fresh copy of the model for ``--steps`` steps in each precision (logit KL + layer distillation
from the unpruned model, as ``prune.recover=finetune`` with ``prune.finetune.layer_distill=1.0``), the two alternating
so that load from other processes falls on both; the ratio is of the median steps' tokens per second. The last step's
loss of each precision is printed beside it: the two track each other within bfloat16's rounding.
"""

from __future__ import annotations

import argparse
import copy
import logging
import os
import statistics

import torch
from common import lm_task, machine, parse_args


def finetune_rates(model, teacher, batches, precision: str, warmup: int) -> tuple[list[float], float]:
    """Tokens per second of every step after ``warmup`` and the last step's loss, on a copy of ``model``."""
    from headprune.lightning.finetune import finetune_recover

    student = copy.deepcopy(model)
    history = finetune_recover(
        student, batches, max_steps=len(batches), teacher=teacher, distill_weight=0.5, layer_distill=1.0, lr=1e-4,
        accelerator="cpu", precision=precision,
    )  # fmt: skip
    return [h["tokens"] / h["seconds"] for h in history[warmup:]], history[-1]["loss"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="a conf/model name of a causal LM (smollm2, tiny_llama, ...)")
    parser.add_argument("--data", default="lm_wide", help="a conf/data name of an LM dataset")
    parser.add_argument("--examples", type=int, default=64, help="training texts (batched as data.batch_size)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps at the start of every fine-tune")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the two precisions")
    parser.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", 2)))
    args = parse_args(parser, smoke={"model": "tiny_llama", "data": "lm_synthetic", "examples": 8, "warmup": 0, "rounds": 1})
    torch.set_num_threads(args.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    task = lm_task(args.model, args.data, 8)
    batches = task.training_batches(args.examples, seed=0)
    teacher = copy.deepcopy(task.model).eval()
    rates, losses = {"32-true": [], "bf16-mixed": []}, {}
    for _ in range(args.rounds):
        for precision in rates:
            steps, losses[precision] = finetune_rates(task.model, teacher, batches, precision, args.warmup)
            rates[precision] += steps
    tokens = sum(int(b["attention_mask"].sum()) for b in batches)
    print(f"bench_finetune_precision: {args.model} on {len(batches)} {args.data} batches ({tokens} real tokens); {machine()}")
    for precision, steps in rates.items():
        print(f"{precision:>10}: median {statistics.median(steps):.1f} tokens/s over {len(steps)} steps, last loss {losses[precision]:.4f}")
    ratio = statistics.median(rates["bf16-mixed"]) / statistics.median(rates["32-true"])
    print(f"ratio bf16-mixed / 32-true tokens per second = {ratio:.2f}")


if __name__ == "__main__":
    main()
