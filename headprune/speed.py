"""Inference throughput: real evaluation inputs re-batched at a given size, and a fair timing loop.

Forward only, under ``torch.inference_mode``; warm-up passes first; the original and the pruned
model alternate repeat by repeat (so background load hits both alike); CUDA is synchronised
around every timed pass; median and spread over repeats.
"""
from __future__ import annotations

import math
import statistics
import time

import torch
import torch.nn.functional as F

DROP = ("idx", "ids", "labels")


def example_pool(batches) -> dict[str, torch.Tensor]:
    """Concatenate padded batches into one padded tensor per input (labels kept for the decoder lengths)."""
    keys = [k for k, v in batches[0].items() if isinstance(v, torch.Tensor) and v.dim() == 2]
    pool = {}
    for key in keys:
        width = max(b[key].shape[1] for b in batches)
        pad = -100 if key == "labels" else 0
        pool[key] = torch.cat([F.pad(b[key], (0, width - b[key].shape[1]), value=pad) for b in batches])
    if "input_ids" not in pool:
        raise ValueError("the evaluation batches have no input_ids")
    return pool


def make_batches(pool: dict[str, torch.Tensor], batch_size: int, examples: int, seed: int = 0, device="cpu") -> list[dict]:
    """Batches of ``batch_size`` random evaluation examples (about ``examples`` in all), trimmed to their own length."""
    n = pool["input_ids"].shape[0]
    if n == 0:
        raise ValueError("no evaluation examples to time")
    count = max(1, math.ceil(examples / batch_size))
    generator = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(n, generator=generator) for _ in range(math.ceil(count * batch_size / n))])
    batches = []
    for i in range(count):
        rows = order[i * batch_size:(i + 1) * batch_size]
        batch = {k: v[rows] for k, v in pool.items()}
        if "attention_mask" in batch:
            length = int(batch["attention_mask"].sum(1).max())
            for key in ("input_ids", "attention_mask", "token_type_ids"):
                if key in batch:
                    batch[key] = batch[key][:, :length]
        if "labels" in batch and "decoder_input_ids" in batch:
            length = max(1, int((batch["labels"] != -100).sum(1).max()))
            batch["decoder_input_ids"] = batch["decoder_input_ids"][:, :length]
        batches.append({k: v.to(device) for k, v in batch.items() if k not in DROP})
    return batches


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_pass(call, batches, device, clock: str = "wall") -> float:
    """Seconds for one ``call(batch)`` (e.g. a forward pass) over ``batches`` (device synchronised before and after).

    ``clock="process"`` counts this process's CPU seconds instead of wall-clock seconds: on a CPU
    shared with other jobs and one intra-op thread it measures the work, not the waiting.
    """
    timer = time.process_time if clock == "process" else time.perf_counter
    _sync(device)
    start = timer()
    for batch in batches:
        call(batch)
    _sync(device)
    return timer() - start


def compare_throughput(calls: dict, batches: list[dict], warmup: int = 2, repeats: int = 5, device="cpu", clock: str = "wall") -> dict:
    """{name: {examples_per_s (median), spread (std), min, max, seconds[]}} for each ``call(batch)`` on the same batches."""
    examples = sum(b["input_ids"].shape[0] for b in batches)
    times = {name: [] for name in calls}
    names = list(calls)
    with torch.inference_mode():
        for name in names:
            for _ in range(warmup):
                time_pass(calls[name], batches[:max(1, min(len(batches), 4))], device)
        for r in range(repeats):
            for name in (names if r % 2 == 0 else names[::-1]):  # alternate who goes first
                times[name].append(time_pass(calls[name], batches, device, clock))
    out = {}
    for name, seconds in times.items():
        rates = [examples / s for s in seconds]
        out[name] = {"examples_per_s": statistics.median(rates), "spread": statistics.pstdev(rates) if len(rates) > 1 else 0.0,
                     "min": min(rates), "max": max(rates), "seconds": seconds, "examples": examples, "clock": clock}
    return out


def mean_length(batches: list[dict]) -> int:
    """Mean padded source length of the timed batches (the sequence length of the FLOP count)."""
    total = sum(b["input_ids"].numel() for b in batches)
    return max(1, round(total / sum(b["input_ids"].shape[0] for b in batches)))
