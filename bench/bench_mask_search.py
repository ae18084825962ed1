"""Cost-aware mask search (Fisher scores + FLOPs target) with least-squares recovery, beside the plain importance order.

    .venv/bin/python bench/bench_mask_search.py --model-dir <fine-tuned MiniLM dir> [--target speedup=1.3]
    .venv/bin/python bench/bench_mask_search.py            # untuned MiniLM on the synthetic NLI set

With ``--model-dir`` it runs on the local MNLI copy (../shared/data/mnli): scores and recovery on the
importance subset of the training file, quality on dev_matched. Without it the untuned embedded MiniLM
runs on the small synthetic set (a smoke run: the accuracies mean little). It reports the seconds of
each stage and the accuracy of four masks at the same number of heads removed.
"""

from __future__ import annotations

import argparse
import copy
import time

import torch
from common import machine, minilm_task, parse_args


def parse_target(text: str) -> dict:
    """``speedup=1.3`` -> {"speedup": 1.3}."""
    key, _, value = text.partition("=")
    if not value:
        raise SystemExit(f"--target takes KEY=VALUE (speedup=1.3, flops=0.6), got {text!r}")
    return {key: float(value)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir", default=None, help="a fine-tuned MiniLM (save_pruned/save_pretrained dir); runs on MNLI")
    parser.add_argument("--target", default="speedup=1.3", help="speedup=S, flops=F or max_drop=D (points on the selection split)")
    parser.add_argument("--eval-examples", type=int, default=2000)
    parser.add_argument("--recover-examples", type=int, default=512, help="training examples for scores and lsq")
    parser.add_argument("--seq-len", type=int, default=128, help="sequence length of the FLOPs cost model")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parse_args(parser, smoke={"eval_examples": 16, "recover_examples": 8, "seq_len": 32})
    torch.set_num_threads(args.threads)
    from headprune.scoring.importance import fisher_scores, importance_scores
    from headprune.selection.costs import flops_cost_model
    from headprune.selection.greedy import greedy_mask, heads_removed, ranked_heads
    from headprune.selection.lsq import lsq_recover
    from headprune.selection.mask_search import search_mask

    extra = [f"data.importance_size={args.recover_examples}"]
    if args.model_dir:
        task, data = minilm_task(args.eval_examples, [*extra, f"model.pretrained={args.model_dir}"], data="nli_local")
    else:
        task, data = minilm_task(args.eval_examples, extra, data="nli_synthetic")
    model, gates = task.model, task.gates
    batches = list(task.importance_batches())
    seconds = {}

    def timed(name, fn):
        start = time.perf_counter()
        out = fn()
        seconds[name] = time.perf_counter() - start
        return out

    costs = timed("cost model", lambda: flops_cost_model(model, args.seq_len))
    fisher = timed("fisher scores", lambda: fisher_scores(model, gates, batches))
    selection = getattr(task, "selection_split", None) or "importance"  # the task's held-out training subset, never eval
    result = timed(
        "mask search",
        lambda: search_mask(fisher, costs, parse_target(args.target), evaluate=lambda mask: task.evaluate(mask, selection).score),
    )
    n_removed = heads_removed(result.mask)
    importance = importance_scores(model, gates, batches)
    plain = greedy_mask(ranked_heads(importance, list(gates.groups)), gates.groups, n_removed)
    base = task.evaluate(None, "eval").score
    rows = {"importance order": task.evaluate(plain, "eval").score, "fisher + cost search": task.evaluate(result.mask, "eval").score}
    original = copy.deepcopy(model.state_dict())
    for name, mask in (("importance order + lsq", plain), ("fisher + cost search + lsq", result.mask)):
        timed(f"lsq ({name})", lambda: lsq_recover(model, gates, batches, mask=mask))
        rows[name] = task.evaluate(mask, "eval").score
        model.load_state_dict(original)
    print(f"bench_mask_search: MiniLM{' fine-tuned' if args.model_dir else ' untuned'} on {data}, target {args.target}; {machine()}")
    print(
        f"removed {n_removed}/{gates.num_heads} heads; predicted speed-up {result.speedup:.3f}, FLOPs kept {result.kept_fraction:.3f} "
        f"(seq_len {args.seq_len}); {sum(b['input_ids'].shape[0] for b in batches)} training examples for scores and lsq"
        + (f"; {len(result.evaluations)} evaluations on {selection}" if result.evaluations else "")
    )
    print(f"{'stage':34s} {'seconds':>9s}")
    for name, value in seconds.items():
        print(f"{name:34s} {value:9.2f}")
    print(f"{'mask (same heads removed)':34s} {'accuracy':>9s} {'drop':>7s}")
    print(f"{'unpruned':34s} {base:9.2f} {0:7.2f}")
    for name, score in rows.items():
        print(f"{name:34s} {score:9.2f} {base - score:7.2f}")


if __name__ == "__main__":
    main()
