"""Decode speed and KV bytes of an LLM at a long context with the streaming cache vs the full cache, side by side in one run.

    .venv/bin/python bench/bench_stream_cache.py [--model smollm2] [--context 4096] [--new-tokens 64] [--repeats 5]
    .venv/bin/python bench/bench_stream_cache.py --fraction 0.667 --sink 64 --window 256
    .venv/bin/python bench/bench_stream_cache.py --smoke  # check that it runs (tiny model, short context)

In every layer ``round(fraction * KV groups)`` KV groups (the first ones: which groups does not change the cost) are
streamed: they keep their first ``sink`` tokens and a rolling window of ``window`` (headprune.core.stream_cache).
The prompt is the evaluation texts joined and cut to ``context`` tokens. Per repeat and cache, the prompt fills a
fresh cache (not timed), then ``new-tokens`` greedy decode steps are timed; the two caches alternate who goes
first. The gain is the ratio of mean decode times with its 95% interval and the noise verdict
(headprune.engine.verdict). KV bytes are those the caches hold after the last step, beside the analytic count.
``--check`` (default) also decodes with the gated model and the full cache: the streaming cache must give its tokens.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import lm_task, machine, parse_args


def streamed_mask(gates, fraction: float) -> dict:
    """Stream the first ``round(fraction * KV groups)`` KV groups (at least 0, at most all) of every layer."""
    layers, units = gates.groups["dec_self"]
    count = min(units, max(0, int(fraction * units + 0.5)))
    mask = torch.ones(layers, units)
    mask[:, :count] = 0
    return {"dec_self": mask}


def long_prompt(task, context: int, batch_size: int) -> torch.Tensor:
    """(batch, context) token ids: the evaluation texts joined (repeated if they are too few), cut to ``context``."""
    texts = task.data.split("eval")
    ids: list[int] = []
    while len(ids) < context * batch_size:
        for text in texts:
            ids.extend(text)
    return torch.tensor(ids[: context * batch_size]).view(batch_size, context)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def decode(model, prompt: torch.Tensor, cache, new_tokens: int, device) -> tuple[float, torch.Tensor, torch.Tensor]:
    """Fill ``cache`` with the prompt, then time ``new_tokens`` greedy steps: (seconds, tokens (B, N), last logits (B, V))."""
    logits = model(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]
    tokens = []
    sync(device)
    start = time.perf_counter()
    for _ in range(new_tokens):
        token = logits.argmax(-1, keepdim=True)
        tokens.append(token)
        logits = model(input_ids=token, past_key_values=cache, use_cache=True).logits[:, -1]
    sync(device)
    return time.perf_counter() - start, torch.cat(tokens, 1), logits


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--data", default="lm_local")
    parser.add_argument("--context", type=int, default=4096, help="prompt tokens in the cache before decoding")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--sink", type=int, default=64)
    parser.add_argument("--window", type=int, default=256)
    parser.add_argument("--fraction", type=float, default=0.5, help="share of every layer's KV groups streamed (rounded)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--texts", type=int, default=64, help="evaluation texts the prompt is made of")
    parser.add_argument("--check", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parse_args(
        parser,
        smoke={
            "model": "tiny_llama",
            "data": "lm_synthetic",
            "context": 96,
            "new_tokens": 4,
            "sink": 4,
            "window": 16,
            "repeats": 2,
            "texts": 8,
        },
    )
    torch.set_num_threads(args.threads)
    from transformers import DynamicCache

    from headprune.core.stream_cache import StreamCache, held_kv_bytes, stream_cache_bytes
    from headprune.core.stream_gates import StreamGates
    from headprune.engine.machine_load import busy_text, machine_record
    from headprune.engine.verdict import gain_summary, gain_text, verdict

    task = lm_task(args.model, args.data, args.texts)
    device = torch.device(args.device)
    model = task.model.to(device).eval()
    gates = StreamGates(task.gates, args.sink, args.window)
    mask = streamed_mask(gates, args.fraction)
    prompt = long_prompt(task, args.context, args.batch_size).to(device)
    caches = {"full": lambda: DynamicCache(config=model.config), "stream": lambda: StreamCache(gates, mask)}
    seconds = {name: [] for name in caches}
    held = {}
    load = machine_record(args.threads)  # the threads and the cores other processes keep busy, before timing
    with torch.inference_mode():
        same = None
        if args.check:
            with gates.masked(mask):
                _, gated_tokens, gated_logits = decode(model, prompt, DynamicCache(config=model.config), args.new_tokens, device)
            _, tokens, logits = decode(model, prompt, caches["stream"](), args.new_tokens, device)
            gap = float((logits - gated_logits).abs().max() / gated_logits.abs().max())
            same = f"{torch.equal(tokens, gated_tokens)} (last logits within {gap:.1e} of their scale)"
        for r in range(args.repeats + 1):  # repeat 0 warms up
            for name in list(caches) if r % 2 == 0 else list(caches)[::-1]:
                cache = caches[name]()
                spent, _, _ = decode(model, prompt, cache, args.new_tokens, device)
                if r > 0:
                    seconds[name].append(spent)
                held[name] = held_kv_bytes(cache)
    tokens_done = args.batch_size * args.new_tokens
    analytic = stream_cache_bytes(gates, mask, args.context + args.new_tokens, batch=args.batch_size)
    layers, units = gates.groups["dec_self"]
    streamed = int((mask["dec_self"] == 0).sum())
    print(
        f"bench_stream_cache: {args.model}, {streamed}/{layers * units} KV groups streamed (sink {args.sink}, window {args.window}), "
        f"context {args.context}, batch {args.batch_size}, {args.new_tokens} decode steps; {machine()}; device {device}; {args.threads} threads, load {load['load_average']}, {load['free_cores']} free cores"
    )
    if load["busy"]:
        print(f"not a measurement: {busy_text(load)}: the gain below is inconclusive")
    if same is not None:
        print(f"stream cache tokens == gated model with the full cache: {same}")
    print(f"{'':7s} {'decode tok/s':>18s} {'KV bytes held':>15s}")
    for name in caches:
        rates = [tokens_done / s for s in seconds[name]]
        spread = statistics.pstdev(rates) if len(rates) > 1 else 0.0
        print(f"{name:7s} {tokens_done / statistics.fmean(seconds[name]):10.1f} +- {spread:5.1f} {held[name]:15,d}")
    summary = gain_summary(seconds["full"], seconds["stream"])
    print(
        f"decode gain of the stream cache: {gain_text({**summary, 'verdict': 'inconclusive' if load['busy'] else verdict(summary)})} over {summary['repeats']} "
        f"repeats; KV cache x{held['full'] / held['stream']:.3f} smaller; "
        f"held bytes == analytic count ({analytic:,d}): {held['stream'] == analytic}"
    )


if __name__ == "__main__":
    main()
