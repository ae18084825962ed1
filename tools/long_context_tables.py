"""docs/results_long_context.md's tables and figure: streaming runs (``prune.action=stream``) at several context lengths.

Each run is a plain prune run's results.json (its orders' steps: fraction streamed, score, KV bytes); the runs of one
metric at lengths 1k, 2k, 4k share their orders' scores (``prune.scores_from``), so a fraction streams the same KV
groups at every length.

    python tools/long_context_tables.py   # renders the blocks of docs/results_long_context.md and its figure
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ORDER_STYLE = {"importance": "C0", "fisher": "C4", "retrieval": "C2", "duo": "C3", "random": "C7"}


def curve(results: dict, order: str) -> list[tuple[float, float, float]]:
    """[(fraction streamed, score, KV fraction held)] of ``order``, the unpruned model (fraction 0) first."""
    steps = [(0.0, float(results["base_score"]), 1.0)]
    steps += [(float(s["fraction"]), float(s["score"]), float(s["kv_fraction"])) for s in results["orders"][order]["steps"]]
    return sorted({f: (f, score, kv) for f, score, kv in steps}.values())


def largest_within(results: dict, order: str, points: float | None = None, relative: float | None = None) -> float:
    """The largest fraction streamed whose score stays within ``points`` (higher is better) or ``relative`` (a
    perplexity: at most (1 + relative) x the unpruned one) of the unpruned model (0 when none)."""
    base = float(results["base_score"])
    best = 0.0
    for fraction, score, _ in curve(results, order):
        ok = score >= base - points if points is not None else score <= base * (1 + relative)
        if ok:
            best = max(best, fraction)
    return best


def within_table(passkey: dict, perplexity: dict | None, points: float = 1.0, relative: float = 0.01) -> str:
    """Per order: the largest fraction streamed at <= ``points`` of passkey accuracy and <= ``relative`` perplexity; the
    passkey column is not judged where the unpruned model retrieves too few keys (long_context_cells.judged)."""
    from long_context_cells import JUDGED_FROM, judged

    lines = [
        f"| order | largest streamed, passkey within {points:g} point | largest streamed, perplexity within {relative:.0%} |",
        "|---|---:|---:|",
    ]
    for order in passkey["orders"]:
        ppl = f"{largest_within(perplexity, order, relative=relative):.0%}" if perplexity and order in perplexity["orders"] else "n/a"
        key = (
            f"{largest_within(passkey, order, points=points):.0%}" if judged(passkey) else f"not judged (unpruned below {JUDGED_FROM:.0f}%)"
        )
        lines.append(f"| {order} | {key} | {ppl} |")
    n = f"{passkey['n_examples']} prompts" + (f", {perplexity['n_examples']} documents" if perplexity else "")
    return "\n".join(lines) + f"\n\n{n}."


def full_set(step: dict) -> set[tuple[int, int]]:
    """The (layer, KV group) pairs a step keeps at full attention (mask 1)."""
    (rows,) = step["mask"].values()
    return {(layer, k) for layer, row in enumerate(rows) for k, v in enumerate(row) if v >= 0.5}


def overlap_table(results: dict, reference: str = "duo") -> str:
    """Per fraction: how many of the KV groups ``reference`` keeps full each other order keeps full too, beside what a
    random choice of as many would share on average (kept / all)."""
    others = [o for o in results["orders"] if o != reference]
    lines = [
        f"| streamed | kept full | {' | '.join(f'{o} and {reference}' for o in others)} | chance |",
        "|---:|---:|" + "---:|" * (len(others) + 1),
    ]
    total = int(results["units_total"])
    for i, step in enumerate(results["orders"][reference]["steps"]):
        ref = full_set(step)
        shared = [len(ref & full_set(results["orders"][o]["steps"][i])) for o in others]
        cells = [f"{n} ({n / len(ref):.0%})" if ref else "-" for n in shared]
        lines.append(f"| {step['fraction']:.0%} | {len(ref)} | " + " | ".join(cells) + f" | {len(ref) / total:.0%} |")
    return "\n".join(lines)


def figure(passkey: dict[int, dict], perplexity: dict[int, dict], path: Path) -> Path:
    """Passkey accuracy (top) and perplexity (bottom) against the fraction of KV groups streamed, one column per length."""
    lengths = sorted(passkey)
    fig, axes = plt.subplots(2, len(lengths), figsize=(4 * len(lengths), 6.5), squeeze=False)
    for col, length in enumerate(lengths):
        for row, runs, label in ((0, passkey, "passkey exact match (%)"), (1, perplexity, "perplexity")):
            ax = axes[row][col]
            if length not in runs:
                ax.set_visible(False)
                continue
            for order in runs[length]["orders"]:
                points = curve(runs[length], order)
                ax.plot([100 * f for f, _, _ in points], [s for _, s, _ in points], "o-", color=ORDER_STYLE.get(order), label=order)
            ax.set_title(f"{length:,} tokens")
            ax.set_xlabel("KV groups streamed (%)")
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("SmolLM2-135M: streaming KV groups (sink 64, window 256), orders scored at 1,024 tokens")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _load(results_dir: Path, name: str) -> dict | None:
    path = results_dir / f"{name}.json"
    return json.loads(path.read_text())["results"] if path.is_file() else None


def merged(parts: list[dict]) -> dict:
    """One run's results from runs of the same prompts that took other orders or fractions (their unpruned scores must agree)."""
    first = parts[0]
    for part in parts[1:]:
        if abs(float(part["base_score"]) - float(first["base_score"])) > 1e-9 or part["n_examples"] != first["n_examples"]:
            raise ValueError(f"runs of other prompts cannot be merged: unpruned {part['base_score']} vs {first['base_score']}")
    orders: dict[str, dict] = {}
    for part in parts:  # an order run in several parts (other fractions) keeps every part's steps, one per fraction
        for order, curve in part["orders"].items():
            steps = {round(s["fraction"], 9): s for s in orders.get(order, {}).get("steps", []) + curve["steps"]}
            orders[order] = {**orders.get(order, {}), **curve, "steps": [steps[f] for f in sorted(steps)]}
    return {**first, "orders": orders}


def runs_of(results_dir: Path, prefix: str) -> dict[int, dict]:
    """{context length: results} of docs/results/<prefix>_<length>.json, or of its parts <prefix>_<length>_<part>.json
    (runs of the same prompts, each with some of the orders) merged."""
    found = {}
    for length in (1024, 2048, 4096):
        whole = _load(results_dir, f"{prefix}_{length}")
        parts = (
            [whole] if whole is not None else [_load(results_dir, p.stem) for p in sorted(results_dir.glob(f"{prefix}_{length}_*.json"))]
        )
        if parts:
            found[length] = merged(parts)
    return found
