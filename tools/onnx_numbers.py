"""A deployer's numbers of pruned classifiers in ONNX Runtime: accuracy of f32 and int8 graphs, and throughput beside
the unpruned model in eager PyTorch and in ONNX Runtime int8 (what a deployer would do instead of pruning: quantize).

    python tools/onnx_numbers.py --model unpruned=<dir> --model control=<dir> --model 43-heads=<dir> ... \
        [--data nli_local] [--limit-eval 0] [--batch-sizes 1 64] [--threads 1] [--repeats 5] [--no-speed] [--out f.json]

Each ``--model`` is a model directory (a task's ``model/``, or ``<prune run>/models/<point>/``, pruned in any unit);
the first is the unpruned reference; the heads and FFN neurons each keeps are recorded. Every model is exported to ONNX (f32) and quantized to int8 (per channel, as
``experiment=export export.quantize=int8`` writes it), and the task's evaluation split (``--limit-eval 0``: all of
it) is scored through ONNX Runtime at each batch size (int8 accuracy moves with the batching: dynamic quantization
scales each batch's activations), beside the PyTorch score. Throughput: examples/s of ``--examples`` evaluation
examples at each batch size, every model and runtime taking turns repeat by repeat; each gain is a paired ratio of
the same repeats with its 95% interval and verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from shown_paths import shown  # noqa: E402


def load(directory: str, data: str, limit_eval: int | None, model: str):
    """The task with ``directory``'s model (``model.pretrained``), scored on the whole evaluation split when limit_eval is None."""
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    from headprune.tasks.registry import load_task

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "experiment=ablate",
                f"model={model}",
                f"data={data}",
                f"data.limit_eval={'null' if limit_eval is None else limit_eval}",
                "logger=none",
                "device=cpu",
            ],
        )
    with open_dict(cfg):  # set, not parsed as overrides: a point's directory holds '=' (fisher+finetune@speedup=1.3)
        cfg.model.pretrained = cfg.model.tokenizer = str(directory)
        cfg.paths.data_dir = os.environ.get("HEADPRUNE_DATA_DIR", str(ROOT.parent / "shared" / "data"))
        cfg.paths.output_dir = tempfile.mkdtemp(prefix="headprune-onnx-numbers-")
    task = load_task(cfg)
    task.model.eval()
    return task


def runtimes(task, folder: Path, threads: int) -> dict:
    """{"torch": the model, "onnx f32": ..., "onnx int8": ...}: the model and its graphs in ONNX Runtime."""
    from headprune.export.onnx import export_onnx, quantize_int8
    from headprune.export.runtime import OnnxRuntimeModel

    task.gates.remove()  # the plain model: what a deployer exports and runs
    example = task.timing_batches(4, 4, "eval")[0]
    graphs = export_onnx(task.model, example, folder)
    return {
        "torch": task.model,
        "onnx f32": OnnxRuntimeModel(graphs, task.model.config, threads),
        "onnx int8": OnnxRuntimeModel(quantize_int8(graphs, folder / "int8"), task.model.config, threads),
    }


def onnx_accuracies(task, runners: dict, batch_sizes: list[int]) -> dict:
    """{runtime: {batch size: score}} of the ONNX graphs on the evaluation split: int8 at each batch size, f32 at the largest."""
    from headprune.measures.evaluation import swapped_model

    out = {}
    for name in ("onnx f32", "onnx int8"):
        out[name] = {}
        for size in batch_sizes if name == "onnx int8" else [max(batch_sizes)]:  # f32 does not move with the batching
            with swapped_model(task, runners[name], task.gates):
                out[name][str(size)] = task.evaluate(None, split="eval", batch_size=size).score
            print(f"  {name} at batch {size}: {out[name][str(size)]:.2f}", flush=True)
    return out


def throughput(tasks: dict, runners: dict, sizes: list[int], examples: int, repeats: int, clock: str) -> dict:
    """Examples/s of every (model, runtime) at each batch size, taking turns; gains against unpruned torch and int8."""
    from headprune.engine.timing import compare_throughput
    from headprune.engine.verdict import gain_summary, verdict

    first = next(iter(tasks))
    out = {}
    for size in sizes:
        batches = tasks[first].timing_batches(size, examples, "eval")
        calls = {
            f"{model} {runtime}": (lambda m: lambda b: m(**b))(runner) for model in runners for runtime, runner in runners[model].items()
        }
        timing = compare_throughput(calls, batches, warmup=1, repeats=repeats, clock=clock)
        rows = {}
        for name, measured in timing.items():
            row = {"examples_per_s": measured["examples_per_s"], "seconds": measured["seconds"]}
            for against in (f"{first} torch", f"{first} onnx int8"):
                summary = gain_summary(timing[against]["seconds"], measured["seconds"])
                row[f"vs {against}"] = {**summary, "verdict": verdict(summary)}
            rows[name] = row
            print(f"  batch {size} {name}: {measured['examples_per_s']:.1f} examples/s", flush=True)
        out[str(size)] = rows
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", required=True, help="name=directory (the first: the unpruned reference)")
    parser.add_argument("--task-model", default="minilm", help="the model= config the directories are of")
    parser.add_argument("--data", default="nli_local")
    parser.add_argument("--limit-eval", type=int, default=0, help="evaluation examples (0: the whole split)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--examples", type=int, default=256, help="examples per timed pass")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clock", choices=["wall", "process"], default="wall")
    parser.add_argument("--no-accuracy", action="store_true")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    from headprune.core.ffn.sites import find_ffn_sites

    torch.set_num_threads(args.threads)
    bad = [item for item in args.model if "=" not in item or not item.split("=", 1)[0]]
    names = [item.split("=", 1)[0] for item in args.model]
    if bad or len(set(names)) < len(names):
        parser.error(f"--model takes name=path, each name once: got {bad or names}")
    models = dict(item.split("=", 1) for item in args.model)
    missing = [path for path in models.values() if not (Path(path) / "config.json").is_file()]
    if missing:
        parser.error(f"no model directory (config.json) at {missing[0]}: give a task's model/ or a prune run's models/<point>/")
    result = {"settings": {k: v for k, v in vars(args).items() if k not in ("out", "model")}, "models": {}}
    tasks, runners = {}, {}
    folder = Path(tempfile.mkdtemp(prefix="headprune-onnx-numbers-"))
    for name, directory in models.items():
        print(f"{name}: {directory}", flush=True)
        task = tasks[name] = load(directory, args.data, args.limit_eval or None, args.task_model)
        heads = sum(len(site.head_ids) for site in task.gates.sites)
        neurons = sum(site.width for site in find_ffn_sites(task.model))
        result["models"][name] = {
            "directory": shown(directory),
            "heads": heads,
            "neurons": neurons,
            "eval_examples": task.split_sizes()["eval"],
        }
        torch_score = None if args.no_accuracy else task.evaluate(None, split="eval").score
        runners[name] = runtimes(task, folder / name, args.threads)
        if torch_score is not None:
            result["models"][name]["accuracy"] = {"torch": torch_score, **onnx_accuracies(task, runners[name], args.batch_sizes)}
    if not args.no_speed:
        result["throughput"] = throughput(tasks, runners, args.batch_sizes, args.examples, args.repeats, args.clock)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
