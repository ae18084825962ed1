"""The gain of a pruned MiniLM in ONNX Runtime beside its gain in PyTorch and the FLOP-ideal, and int8 beside f32.

    .venv/bin/python bench/bench_export.py                  # MiniLM, 50% of heads (importance, uneven), batch 64 x 128, 1 thread
    .venv/bin/python bench/bench_export.py --smoke          # a tiny random BERT, seconds: checks that the benchmark runs

All six models (PyTorch, ONNX f32 and ONNX int8, each unpruned and pruned) are timed side by side in one run,
alternating repeat by repeat; each gain is a paired ratio of the same repeats with its 95% interval and verdict.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch
from common import machine, parse_args

PAIRS = (
    ("PyTorch", "torch original", "torch pruned"),
    ("ONNX Runtime f32", "onnx f32 original", "onnx f32 pruned"),
    ("ONNX Runtime int8", "onnx int8 original", "onnx int8 pruned"),
)


def tiny_bert():
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, num_labels=3)
    return BertForSequenceClassification(config).eval()


def model_and_mask(args):
    """(model, mask, task or None, what): MiniLM with importance on the MNLI training subset, or a tiny BERT with random scores."""
    from headprune.core.attention.gates import HeadGates
    from headprune.selection.greedy import random_scores
    from headprune.selection.uniform import layout_masks

    if args.smoke:
        model = tiny_bert()
        gates = HeadGates(model)
        mask = layout_masks(random_scores(gates.groups, 0), gates.groups, [args.fraction])[0]
        return model, mask, None, "tiny random BERT, random scores"
    from common import minilm_task
    from omegaconf import OmegaConf

    from headprune.sources.orders import OrderSettings, order_scores

    task, data = minilm_task(args.eval_examples, ["data.importance_size=64"])
    importance = OmegaConf.create({"reduce": "example", "normalize_layers": True, "normalize_global": False})
    scores = order_scores(task, "importance", OrderSettings(importance, seed=0, ablation_split=None, n_samples=None))
    return task.model, layout_masks(scores, task.gates.groups, [args.fraction])[0], task, f"MiniLM, importance on {data}"


def timing_inputs(model, batch: int, length: int, count: int) -> list[dict]:
    """``count`` batches of random token ids, ``batch`` x ``length``, no padding (the FLOPs of the ideal gain)."""
    generator = torch.Generator().manual_seed(0)
    out = []
    for _ in range(count):
        ids = torch.randint(5, model.config.vocab_size, (batch, length), generator=generator)
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)})
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fraction", type=float, default=0.5)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--batches", type=int, default=1, help="batches per timed pass")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["wall", "process"], default="wall")
    parser.add_argument("--eval-examples", type=int, default=300, help="MNLI examples of the int8 accuracy check")
    args = parse_args(parser, smoke={"batch": 4, "length": 16, "repeats": 2})  # --smoke: a tiny random BERT as well
    torch.set_num_threads(args.threads)
    from headprune.core.attention.gates import HeadGates
    from headprune.core.counting import model_cost
    from headprune.core.pruning import prune_mask
    from headprune.engine.timing import compare_throughput
    from headprune.engine.verdict import gain_summary, gain_text, verdict
    from headprune.export.onnx import export_onnx, quantize_int8
    from headprune.export.runtime import OnnxRuntimeModel
    from headprune.measures.evaluation import swapped_model

    model, mask, task, what = model_and_mask(args)
    original = copy.deepcopy(model)
    HeadGates(original).remove()
    pruned = copy.deepcopy(original)
    prune_mask(pruned, mask)
    HeadGates(pruned).remove()
    per_layer = [len(s.head_ids) for s in HeadGates(pruned).sites]
    batches = timing_inputs(original, args.batch, args.length, args.batches)
    folder = Path(tempfile.mkdtemp(prefix="bench-export-"))
    models = {"torch original": original, "torch pruned": pruned}
    for name, source in (("original", original), ("pruned", pruned)):
        graphs = export_onnx(source, batches[0], folder / name)
        models[f"onnx f32 {name}"] = OnnxRuntimeModel(graphs, source.config, args.threads)
        models[f"onnx int8 {name}"] = OnnxRuntimeModel(quantize_int8(graphs, folder / name / "int8"), source.config, args.threads)
    with torch.no_grad():
        logits = {name: m(**batches[0]).logits for name, m in models.items()}
    calls = {name: (lambda m: lambda batch: m(**batch))(m) for name, m in models.items()}
    timing = compare_throughput(calls, batches, warmup=1, repeats=args.repeats, clock=args.clock)
    ideal = model_cost(original, args.length).flops / model_cost(pruned, args.length).flops - 1
    print(
        f"bench_export: {what}; {sum(per_layer)}/{sum(s.num_heads_orig for s in HeadGates(original).sites)} heads kept "
        f"(per layer {per_layer}); batch {args.batch} x {args.length} tokens, {args.repeats} repeats, clock={args.clock}; {machine()}"
    )
    print(f"{'model':>20s} {'examples/s':>12s}   max |logits - PyTorch| (same model)")
    for name in models:
        reference = logits["torch pruned" if "pruned" in name else "torch original"]
        print(f"{name:>20s} {timing[name]['examples_per_s']:12.2f}   {float((logits[name] - reference).abs().max()):.2e}")
    print(f"{'runtime':>20s} {'pruned vs unpruned gain [95% interval]':>40s} {'verdict':>13s} {'gain/FLOP-ideal':>16s}")
    for label, first, second in PAIRS:
        summary = gain_summary(timing[first]["seconds"], timing[second]["seconds"])
        row = {**summary, "verdict": verdict(summary)}
        print(f"{label:>20s} {gain_text(row):>40s} {row['verdict']:>13s} {summary['gain'] / ideal:16.2f}")
    print(f"{'FLOP-ideal':>20s} {100 * ideal:+39.1f}%")
    for name in ("original", "pruned"):
        summary = gain_summary(timing[f"onnx f32 {name}"]["seconds"], timing[f"onnx int8 {name}"]["seconds"])
        versus = gain_summary(timing[f"torch {name}"]["seconds"], timing[f"onnx f32 {name}"]["seconds"])
        agree = float((logits[f"onnx int8 {name}"].argmax(-1) == logits[f"onnx f32 {name}"].argmax(-1)).float().mean())
        print(
            f"{name}: int8 vs f32 in ONNX Runtime {gain_text({**summary, 'verdict': verdict(summary)})}; "
            f"ONNX Runtime f32 vs PyTorch {gain_text({**versus, 'verdict': verdict(versus)})}; int8 argmax = f32 argmax on {100 * agree:.0f}%"
        )
    if task is not None:  # the metric of the evaluation split through each runtime (the classifier head is MiniLM's untrained one)
        scores = {}
        for name in ("torch pruned", "onnx f32 pruned", "onnx int8 pruned"):
            runner = models[name] if name.startswith("onnx") else None
            if runner is None:
                scores[name] = task.evaluate(mask, split="eval").score
            else:
                with swapped_model(task, runner, task.gates):
                    scores[name] = task.evaluate(None, split="eval").score
        print(
            f"accuracy of the pruned model on {task.split_sizes()['eval']} eval examples (untrained 3-way head): "
            + ", ".join(f"{k} {v:.2f}%" for k, v in scores.items())
        )


if __name__ == "__main__":
    main()
