"""Inference throughput: real evaluation inputs re-batched at a given size, and a fair timing loop."""

import math
import statistics
import time
from contextvars import ContextVar

import torch
from torch.nn.utils.rnn import pad_sequence

from headprune.core.checks import ConfigError
from headprune.core.inputs import ENCODER_INPUTS, NON_INPUTS
from headprune.engine.machine_load import busy_text, machine_record
from headprune.engine.verdict import gain_summary, verdict


def example_pool(batches) -> dict[str, torch.Tensor]:
    """Concatenate batches into one tensor per input: token inputs padded to the longest, image inputs (B, C, H, W) as they are."""
    keys = [k for k, v in batches[0].items() if isinstance(v, torch.Tensor) and v.dim() >= 2]
    pool = {  # every example's row; an image's (C, H, W) rows are all of one size already
        key: pad_sequence([row for b in batches for row in b[key]], batch_first=True, padding_value=-100 if key == "labels" else 0)
        for key in keys
    }
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
            batch.update({key: batch[key][:, :length] for key in ENCODER_INPUTS if key in batch})
        if "labels" in batch and "decoder_input_ids" in batch:
            length = max(1, int((batch["labels"] != -100).sum(1).max()))
            batch["decoder_input_ids"] = batch["decoder_input_ids"][:, :length]
        batches.append({k: v.to(device) for k, v in batch.items() if k not in NON_INPUTS})
    return batches


_DEADLINE: ContextVar[float | None] = ContextVar("headprune_timing_deadline", default=None)
_CUT: ContextVar[list | None] = ContextVar("headprune_timing_cut", default=None)


class TimeBudgetError(ConfigError):
    """The time budget (speed.max_seconds) ran out before both models were timed once."""


def seconds_left() -> float | None:
    """Seconds left of the running measurement's time budget (None: no budget): a long call (generation) stops there."""
    deadline = _DEADLINE.get()
    return None if deadline is None else max(0.0, deadline - time.perf_counter())


def budget_cut() -> None:
    """Called by a timed call that stopped early at the time budget (e.g. generation cut short): its pass is not used."""
    cut = _CUT.get()
    if cut is not None:
        cut.append(True)


def time_pass(call, batches, device, clock: str = "wall") -> float | None:
    """Seconds for one ``call(batch)`` (e.g. a forward pass) over ``batches`` (device synchronised before and after)."""
    timer = time.process_time if clock == "process" else time.perf_counter
    cuda = torch.device(device).type == "cuda"
    cut: list = []
    token = _CUT.set(cut)
    try:
        if cuda:
            torch.cuda.synchronize(device)
        start = timer()
        for batch in batches:
            if seconds_left() == 0.0:  # the time budget ran out
                return None
            call(batch)
        if cuda:
            torch.cuda.synchronize(device)
        return None if cut else timer() - start
    finally:
        _CUT.reset(token)


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
    """{name: {examples_per_s, spread, min, max, seconds[]}} per ``call(batch)``, alternating, adaptive repeats within ``max_seconds``."""
    examples = sum(b["input_ids"].shape[0] for b in batches)
    times = {name: [] for name in calls}
    names = list(calls)
    limit = max(repeats, max_repeats or repeats)
    start = time.perf_counter()
    token = _DEADLINE.set(start + max_seconds if max_seconds > 0 else None)

    def tight() -> bool:
        if len(names) != 2 or tolerance <= 0:
            return True
        interval = gain_summary(times[names[0]], times[names[1]])["gain_interval"]
        return interval is not None and (interval[1] - interval[0]) / 2 <= tolerance

    try:
        with torch.inference_mode():
            for name in names:
                for _ in range(warmup):
                    time_pass(calls[name], batches[: max(1, min(len(batches), 4))], device)
            r = 0
            while (r < repeats or (r < limit and max_seconds > 0 and not tight())) and seconds_left() != 0.0:
                round_ = {name: time_pass(calls[name], batches, device, clock) for name in (names if r % 2 == 0 else names[::-1])}
                if any(seconds is None for seconds in round_.values()):
                    break  # the budget ran out within this round
                for name, seconds in round_.items():
                    times[name].append(seconds)
                r += 1
    finally:
        _DEADLINE.reset(token)
    if not all(times.values()):
        raise TimeBudgetError(
            f"speed.max_seconds={max_seconds:g} ran out before one timed pass of every model ({examples} examples at batch "
            f"{batches[0]['input_ids'].shape[0]}): raise speed.max_seconds, or time less (speed.examples, task.decode_tokens)"
        )
    out = {}
    for name, seconds in times.items():
        rates = [examples / s for s in seconds]
        out[name] = {
            "examples_per_s": examples / statistics.fmean(seconds),  # the rate of the mean time: the gain's own definition
            "spread": statistics.pstdev(rates) if len(rates) > 1 else 0.0,
            "min": min(rates),
            "max": max(rates),
            "seconds": seconds,
            "examples": examples,
            "clock": clock,
            "elapsed_s": time.perf_counter() - start,
        }
    return out


def measure_gain(original, pruned, batches: list[dict], *timing, **options) -> dict:
    """Time ``original`` vs ``pruned``: both timings, the gain with its interval, the machine's load and threads, and a verdict."""
    machine = machine_record(torch.get_num_threads())
    if machine["busy"]:
        print(f"{busy_text(machine)}: timings may be noise, the gain is reported as inconclusive", flush=True)
    timing = compare_throughput({"original": original, "pruned": pruned}, batches, *timing, **options)
    summary = gain_summary(timing["original"]["seconds"], timing["pruned"]["seconds"])
    return {**timing, **summary, "verdict": "inconclusive" if machine["busy"] else verdict(summary), **machine}


def mean_length(batches: list[dict]) -> int:
    """Mean padded source length of the timed batches (the sequence length of the FLOP count)."""
    total = sum(b["input_ids"].numel() for b in batches)
    return max(1, round(total / sum(b["input_ids"].shape[0] for b in batches)))
