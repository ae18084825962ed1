"""An NLI classifier as it is deployed: its HF directory and ONNX export loaded by stock libraries, scored on text.

For each HF directory: parameters, file bytes, load time (stock transformers' AutoModelForSequenceClassification and
AutoTokenizer, median of ``--loads``) and accuracy on a JSONL split tokenized by the directory's own tokenizer (a
vocab-pruned directory: the rewritten one, so text with removed tokens is read through their kept sub-pieces). For each
ONNX export directory: file bytes and load time (an ONNX Runtime session and the tokenizers library's tokenizer.json).

    python tools/deployed_nli.py --save MODEL_DIR RESULTS_JSON OUT_DIR   # a prune run's last point, by save_pruned
    python tools/deployed_nli.py --hf NAME=DIR ... --onnx NAME=DIR ... --split dev_matched.jsonl --out result.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headprune.tasks.nli.files import label_id  # noqa: E402


def dir_bytes(folder: Path) -> int:
    """Bytes of every file of a directory."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def timed(load, loads: int):
    """(the last loaded object, median seconds of ``loads`` loads)."""
    times, out = [], None
    for _ in range(loads):
        start = time.perf_counter()
        out = load()
        times.append(time.perf_counter() - start)
    return out, statistics.median(times)


def read_split(path: Path) -> tuple[list[str], list[str], list[int]]:
    """(premises, hypotheses, label ids) of a JSON Lines split."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["premise"] for r in rows], [r["hypothesis"] for r in rows], [label_id(r["label"], str(path)) for r in rows]


def hf_report(folder: Path, split: tuple, loads: int, batch_size: int, max_length: int) -> dict:
    """Parameters, bytes, load time and accuracy of a stock transformers directory."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    def load():
        return AutoModelForSequenceClassification.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)

    (model, tokenizer), seconds = timed(load, loads)
    premises, hypotheses, labels = split
    correct = 0
    with torch.no_grad():
        for start in range(0, len(labels), batch_size):
            end = start + batch_size
            enc = tokenizer(
                premises[start:end], hypotheses[start:end], truncation=True, max_length=max_length, padding=True, return_tensors="pt"
            )
            predicted = model(**enc).logits.argmax(-1)
            correct += int((predicted == torch.tensor(labels[start:end])).sum())
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": model.config.vocab_size,
        "tokenizer_size": len(tokenizer),
        "bytes": dir_bytes(folder),
        "load_seconds_median": seconds,
        "accuracy": 100.0 * correct / len(labels),
        "examples": len(labels),
    }


def onnx_report(folder: Path, loads: int) -> dict:
    """Bytes and load time (session + tokenizer) of an ONNX export directory."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    def load():
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        session = ort.InferenceSession(str(folder / "model.onnx"), options, providers=["CPUExecutionProvider"])
        return session, Tokenizer.from_file(str(folder / "tokenizer.json"))

    _, seconds = timed(load, loads)
    return {"bytes": dir_bytes(folder), "graph_bytes": (folder / "model.onnx").stat().st_size, "load_seconds_median": seconds}


def save_point(source: Path, results: Path, out: Path) -> None:
    """The last point of a prune run's first order, pruned from ``source`` and written by headprune.save_pruned."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from headprune.core.saving import save_pruned
    from headprune.core.units import prune_unit_mask, unit_gates

    run = json.loads(results.read_text())["results"]
    step = next(iter(run["orders"].values()))["steps"][-1]
    model, tokenizer = AutoModelForSequenceClassification.from_pretrained(source).eval(), AutoTokenizer.from_pretrained(source)
    prune_unit_mask(unit_gates(model, run["unit"]), {g: torch.tensor(m, dtype=torch.float) for g, m in step["mask"].items()})
    save_pruned(model, out, tokenizer=tokenizer)
    print(f"saved the point removing {step['units_removed']} units to {out}", flush=True)


def named(pairs: list[str]) -> dict[str, Path]:
    return {p.split("=", 1)[0]: Path(p.split("=", 1)[1]) for p in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", nargs="*", default=[], help="NAME=DIR of stock transformers directories")
    parser.add_argument("--onnx", nargs="*", default=[], help="NAME=DIR of ONNX export directories")
    parser.add_argument(
        "--save", nargs=3, type=Path, metavar=("MODEL_DIR", "RESULTS_JSON", "OUT_DIR"), help="save a prune run's last point"
    )
    parser.add_argument("--split", type=Path, help="a JSON Lines split (premise, hypothesis, label)")
    parser.add_argument("--loads", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.save:
        save_point(*args.save)
        return
    if args.split is None or args.out is None:
        parser.error("give --split and --out (or --save)")
    import torch

    torch.set_num_threads(1)
    split = read_split(args.split)
    out = {"split": str(args.split.name), "hf": {}, "onnx": {}}
    for name, folder in named(args.hf).items():
        out["hf"][name] = hf_report(folder, split, args.loads, args.batch_size, args.max_length)
        print(name, out["hf"][name], flush=True)
    for name, folder in named(args.onnx).items():
        out["onnx"][name] = onnx_report(folder, args.loads)
        print(name, out["onnx"][name], flush=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
