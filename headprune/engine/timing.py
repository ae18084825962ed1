"""Inference throughput: real evaluation inputs re-batched at a given size, and a fair timing loop.

Forward only, under ``torch.inference_mode``; warm-up passes first; the original and the pruned
model alternate repeat by repeat (so background load hits both alike); CUDA is synchronised
around every timed pass; median and spread over repeats. Repeats go on until the gain's 95%
interval is tight or the time budget runs out, and a gain that stays within the noise is called
``inconclusive`` rather than reported as a number.
"""

from __future__ import annotations

import math
import os
import statistics
import time

import torch
import torch.nn.functional as F

from headprune.engine.verdict import gain_summary, load_average, verdict

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
        rows = order[i * batch_size : (i + 1) * batch_size]
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


def compare_throughput(
    calls: dict,
    batches: list[dict],
    warmup: int = 2,
    repeats: int = 5,
    device="cpu",
    clock: str = "wall",
    max_seconds: float = 0.0,
    tolerance: float = 0.0,
    max_repeats: int | None = None,
) -> dict:
    """{name: {examples_per_s (median), spread (std), min, max, seconds[]}} for each ``call(batch)`` on the same batches.

    The calls alternate repeat by repeat. After ``repeats`` rounds, two calls keep being timed
    until the gain of the second over the first is known to +- ``tolerance`` (95% interval
    half-width), ``max_seconds`` have passed or ``max_repeats`` rounds were run.
    """
    examples = sum(b["input_ids"].shape[0] for b in batches)
    times = {name: [] for name in calls}
    names = list(calls)
    limit = max(repeats, max_repeats or repeats)
    start = time.perf_counter()

    def tight() -> bool:
        if len(names) != 2 or tolerance <= 0:
            return True
        interval = gain_summary(times[names[0]], times[names[1]])["gain_interval"]
        return interval is not None and (interval[1] - interval[0]) / 2 <= tolerance

    with torch.inference_mode():
        for name in names:
            for _ in range(warmup):
                time_pass(calls[name], batches[: max(1, min(len(batches), 4))], device)
        r = 0
        while r < repeats or (r < limit and time.perf_counter() - start < max_seconds and not tight()):
            for name in names if r % 2 == 0 else names[::-1]:  # alternate who goes first
                times[name].append(time_pass(calls[name], batches, device, clock))
            r += 1
    out = {}
    for name, seconds in times.items():
        rates = [examples / s for s in seconds]
        out[name] = {
            "examples_per_s": statistics.median(rates),
            "spread": statistics.pstdev(rates) if len(rates) > 1 else 0.0,
            "min": min(rates),
            "max": max(rates),
            "seconds": seconds,
            "examples": examples,
            "clock": clock,
            "elapsed_s": time.perf_counter() - start,
        }
    return out


def measure_gain(
    original,
    pruned,
    batches: list[dict],
    warmup: int = 2,
    repeats: int = 5,
    device="cpu",
    clock: str = "wall",
    max_seconds: float = 0.0,
    tolerance: float = 0.0,
    max_repeats: int | None = None,
) -> dict:
    """Time ``original`` vs ``pruned`` (adaptive repeats): both timings, the gain with its interval, the load and a verdict."""
    load = load_average()  # the machine's load when this measurement started
    cores = os.cpu_count() or 1
    if load and load[0] > cores + 1:  # this process itself keeps about its own threads busy
        print(
            f"the machine is busy (load {load[0]} on {cores} cores): timings may be noise; "
            "a gain within the noise is reported as inconclusive",
            flush=True,
        )
    timing = compare_throughput(
        {"original": original, "pruned": pruned}, batches, warmup, repeats, device, clock, max_seconds, tolerance, max_repeats
    )
    summary = gain_summary(timing["original"]["seconds"], timing["pruned"]["seconds"])
    return {
        "original": timing["original"],
        "pruned": timing["pruned"],
        **summary,
        "verdict": verdict(summary),
        "load_average": load,
        "cpu_count": cores,
    }


def mean_length(batches: list[dict]) -> int:
    """Mean padded source length of the timed batches (the sequence length of the FLOP count)."""
    total = sum(b["input_ids"].numel() for b in batches)
    return max(1, round(total / sum(b["input_ids"].shape[0] for b in batches)))
