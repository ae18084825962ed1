"""Prefill and decode speed of an LLM with one third of its KV groups removed vs the original, beside the ideals.

    .venv/bin/python bench/bench_llm_decode.py [--model smollm2] [--batch-size 16] [--new-tokens 128] [--repeats 5]
    .venv/bin/python bench/bench_llm_decode.py --mask-file <prune run>/results.json --mask-order fisher --fraction 0.333334
    .venv/bin/python bench/bench_llm_decode.py --model tiny_llama --data lm_synthetic --new-tokens 4 --repeats 1  # check

Per layer, the KV group (a KV head and its query heads) of lowest importance on the training texts is
removed, so each layer keeps equal groups and the KV cache shrinks by a third; ``--mask-file`` times the
KV-group mask of a prune run instead (a global one leaves layers uneven). Prefill: one forward
over left-padded prompts filling the cache; decode: greedy ``generate`` of ``--new-tokens`` tokens with
the KV cache, less the prefill time. The two models alternate repeat by repeat. Ideals: prefill FLOPs,
decode FLOPs per token at the mean context, and decode bytes per step (weights + KV cache read once).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch
from common import lm_task, machine, parse_args


def drop_one_kv_group_per_layer(task) -> dict:
    """The query-head mask that removes, in every layer, the KV group of lowest importance."""
    from headprune.core.masks import kv_to_head_mask
    from headprune.scoring.importance import importance_scores

    scores = importance_scores(task.model, task.gates, task.importance_batches(), unit="kv_group")["dec_self"]  # (L, KV)
    kv_mask = torch.ones_like(scores)
    kv_mask[torch.arange(len(scores)), scores.argmin(1)] = 0
    return kv_to_head_mask({"dec_self": kv_mask}, task.gates.heads_per_kv)


def mask_of_run(task, path: str, order: str, fraction: float) -> dict:
    """The query-head mask of a KV-group prune run's step (``prune.unit=kv_group`` results.json)."""
    from headprune.results.mask_files import choose_candidate, mask_for_model, read_mask_file
    from headprune.tasks.unit_task import in_unit

    kv_task = in_unit(task, "kv_group")
    found = read_mask_file(path, "--mask-file")
    chosen = choose_candidate(found, order, fraction, None, "--mask-file")
    return kv_task.gates.head_mask(mask_for_model(found, chosen, kv_task.gates, kv_task.model, "--mask-file"))


def left_padded(ids: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Prompts padded on the left, as generation needs."""
    width = max(map(len, ids))
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros_like(input_ids)
    for row, seq in enumerate(ids):
        input_ids[row, width - len(seq) :] = torch.tensor(seq)
        attention_mask[row, width - len(seq) :] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def decode_flops_per_token(model, context: int) -> int:
    """Forward FLOPs of one new token attending to ``context`` cached tokens."""
    from headprune.core.attention.gates import find_sites
    from headprune.core.counting import model_cost

    width = sum(site.linear("query").out_features for site in find_sites(model))  # computed heads * head_dim
    return model_cost(model, seq_len=1).flops + 2 * 2 * (context - 1) * width  # q k^T and probs @ v over the context


def param_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def timed(fn, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--data", default="lm_local")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=64, help="prompts are cut to this many tokens")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--importance-texts", type=int, default=64)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--mask-file", help="a prune.unit=kv_group run's results.json (default: one KV group per layer)")
    parser.add_argument("--mask-order", default="fisher")
    parser.add_argument("--fraction", type=float, default=0.333334)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parse_args(
        parser,
        smoke={
            "model": "tiny_llama",
            "data": "lm_synthetic",
            "batch_size": 2,
            "prompt_tokens": 4,
            "new_tokens": 4,
            "repeats": 1,
            "importance_texts": 4,
        },
    )
    torch.set_num_threads(args.threads)
    from headprune.core.counting import kv_cache_bytes_per_token, model_cost
    from headprune.core.pruning import prune_mask
    from headprune.engine.machine_load import busy_text, machine_record

    task = lm_task(args.model, args.data, args.importance_texts)
    mask = mask_of_run(task, args.mask_file, args.mask_order, args.fraction) if args.mask_file else drop_one_kv_group_per_layer(task)
    device = torch.device(args.device)
    pruned = copy.deepcopy(task.model)
    prune_mask(pruned, mask)
    task.gates.set_mask(None)
    models = {"original": task.model.to(device).eval(), "pruned": pruned.to(device).eval()}

    prompts = [ids[: args.prompt_tokens] for ids in task.data.split("eval")[: args.batch_size]]
    batch = {k: v.to(device) for k, v in left_padded(prompts, task.data.pad_id).items()}
    prompt_tokens = int(batch["attention_mask"].sum())
    new_tokens = args.batch_size * args.new_tokens
    generate = dict(
        max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False, use_cache=True, pad_token_id=task.data.pad_id
    )
    load = machine_record(args.threads)  # the threads and the cores other processes keep busy, before timing
    with torch.inference_mode():
        with task.gates.masked(mask):
            masked = models["original"].generate(**batch, **generate)  # also the warm-up
        same = torch.equal(models["pruned"].generate(**batch, **generate), masked)
        times = {name: {"prefill": [], "decode": []} for name in models}
        for r in range(args.repeats):
            for name in list(models) if r % 2 == 0 else list(models)[::-1]:  # alternate who goes first
                model = models[name]
                prefill = timed(lambda: model(**batch, use_cache=True, logits_to_keep=1), device)
                total = timed(lambda: model.generate(**batch, **generate), device)
                times[name]["prefill"].append(prompt_tokens / prefill)
                times[name]["decode"].append(new_tokens / max(total - prefill, 1e-9))

    width = batch["input_ids"].shape[1]
    context = width + args.new_tokens // 2  # mean context of a decode step
    cost = {n: model_cost(m, seq_len=width).flops for n, m in models.items()}
    decode_flops = {n: decode_flops_per_token(m, context) for n, m in models.items()}
    kv = {n: kv_cache_bytes_per_token(m) for n, m in models.items()}
    step_bytes = {n: param_bytes(m) + args.batch_size * context * kv[n] for n, m in models.items()}
    print(
        f"bench_llm_decode: {args.model}, {int(mask['dec_self'].numel() - mask['dec_self'].sum())}/{mask['dec_self'].numel()} "
        f"query heads pruned ({'mask of ' + args.mask_file if args.mask_file else 'one KV group per layer'}), batch {args.batch_size}, prompt width {width}, {args.new_tokens} new tokens; "
        f"{machine()}; device {device}; pruned generation == masked generation: {same}; {args.threads} threads, "
        f"load {load['load_average']}, {load['free_cores']} free cores"
    )
    if load["busy"]:
        print(f"not a measurement: {busy_text(load)}")
    print(f"{'':9s} {'prefill tok/s':>16s} {'decode tok/s':>16s} {'KV bytes/token':>15s} {'params':>12s}")
    for name in models:
        p, d = times[name]["prefill"], times[name]["decode"]
        print(
            f"{name:9s} {statistics.median(p):10.1f} +- {statistics.pstdev(p):4.1f} {statistics.median(d):10.1f} +- "
            f"{statistics.pstdev(d):4.1f} {kv[name]:15,d} {sum(q.numel() for q in models[name].parameters()):12,d}"
        )
    gain = {kind: statistics.median(times["pruned"][kind]) / statistics.median(times["original"][kind]) for kind in ("prefill", "decode")}
    print(f"measured speed-up: prefill x{gain['prefill']:.3f}, decode x{gain['decode']:.3f}")
    print(
        f"ideal: prefill FLOPs x{cost['original'] / cost['pruned']:.3f}; decode FLOPs/token x{decode_flops['original'] / decode_flops['pruned']:.3f}; "
        f"decode bytes/step (weights + KV cache) x{step_bytes['original'] / step_bytes['pruned']:.3f}; "
        f"KV cache x{kv['original'] / kv['pruned']:.3f} smaller"
    )


if __name__ == "__main__":
    main()
