"""docs/results_long_context.md's cells with their sample: n, a 95% interval on every score, paired tests against random.

Passkey exact match: Wilson's interval of k of n prompts; each order against random on the same prompts: McNemar's
exact test, significant where p stays below 0.05 / m (Bonferroni over the m tests of the table). Perplexity: the t
interval of the corpus ratio over documents, and the ratio of each order's perplexity to random's on the same
documents with its interval. On passkey, orders are judged only at lengths where the unpruned model retrieves at
least 80% of the keys: where it mostly fails, streaming cannot show what it costs. Perplexity is compared at every length.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headprune.scoring.sample_intervals import (  # noqa: E402
    mcnemar_exact,
    paired_perplexity_ratio,
    perplexity_interval,
    wilson_interval,
)

JUDGED_FROM = 80.0  # the unpruned model's passkey exact match (%) from which orders are judged at a length
ALPHA = 0.05


def base_correct(results: dict) -> list[int] | None:
    """The unpruned model's 0/1 per prompt (None for a run from before per-example records)."""
    return (results.get("base_per_example") or {}).get("correct")


def accuracy_cell(score: float, n: int) -> str:
    """``83 [74, 89]``: exact match (%) of n prompts with Wilson's 95% interval."""
    low, high = wilson_interval(round(score * n / 100), n)
    return f"{score:.0f} [{100 * low:.0f}, {100 * high:.0f}]"


def judged(results: dict) -> bool:
    """Whether orders can be judged at this length: the unpruned model retrieves at least ``JUDGED_FROM`` %."""
    return float(results["base_score"]) >= JUDGED_FROM


def not_judged_text(length: int, results: dict) -> str:
    n = int(results["n_examples"])
    return (
        f"no order can be judged at {length:,} tokens: the unpruned model retrieves {accuracy_cell(float(results['base_score']), n)} (%) "
        f"of {n} prompts (below {JUDGED_FROM:.0f}%)"
    )


def curve_table(curve: dict | None, sources: dict[str, dict[int, dict]]) -> str:
    """The unpruned model's exact match over length, one row per measurement with its prompts and interval: the curve of
    tools/passkey_curve.py (None: not measured) and the unpruned scores of the streaming runs ({source: {length: results}})."""
    rows = [
        (int(length), row["n"], row["score"], "tools/passkey_curve.py") for length, row in (curve or {"lengths": {}})["lengths"].items()
    ]
    rows += [
        (length, int(r["n_examples"]), float(r["base_score"]), source) for source, runs in sources.items() for length, r in runs.items()
    ]
    lines = ["| context | prompts | exact match, % [95% interval] | orders judged | from |", "|---:|---:|---:|---|---|"]
    for length, n, score, source in sorted(rows, key=lambda r: (r[0], -r[1])):
        verdict = "yes" if score >= JUDGED_FROM else f"no (below {JUDGED_FROM:.0f}%)"
        lines.append(f"| {length:,} | {n} | {accuracy_cell(score, n)} | {verdict} | {source} |")
    return "\n".join(lines)


def _steps(results: dict, order: str) -> list[dict]:
    base = {"fraction": 0.0, "score": float(results["base_score"]), "kv_fraction": 1.0, "per_example": results.get("base_per_example")}
    return [base] + sorted(results["orders"][order]["steps"], key=lambda s: s["fraction"])


def _step_at(results: dict, order: str, fraction: float) -> dict | None:
    return next((s for s in _steps(results, order) if abs(s["fraction"] - fraction) < 1e-9), None)


def _perplexity_cell(step: dict) -> str:
    values = step.get("per_example") or {}
    if len(values.get("nll", [])) < 2:
        return f"{step['score']:.2f}"
    mean, low, high = perplexity_interval(values["nll"], values["tokens"])
    return f"{mean:.2f} [{low:.2f}, {high:.2f}]"


def cells_table(runs: dict[int, dict], metric: str) -> str:
    """One row per (length, fraction): sample size, KV cache held and each order's score with its 95% interval."""
    orders = list(next(iter(runs.values()))["orders"])
    unit = "prompts" if metric == "passkey" else "documents"
    lines = [
        f"| context | {unit} | streamed | KV cache held | " + " | ".join(orders) + " |",
        "|---:|---:|---:|---:|" + "---:|" * len(orders),
    ]
    for length, results in sorted(runs.items()):
        n = int(results["n_examples"])
        columns = {order: _steps(results, order) for order in orders}
        for i, first in enumerate(columns[orders[0]]):
            cells = [accuracy_cell(c[i]["score"], n) if metric == "passkey" else _perplexity_cell(c[i]) for c in columns.values()]
            lines.append(f"| {length:,} | {n} | {first['fraction']:.0%} | {first['kv_fraction']:.0%} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _reference(results: dict | None, reference: str, fraction: float) -> tuple[str, dict | None]:
    """(name, step) an order is tested against: ``reference`` at the same fraction, else the unpruned model."""
    if results is None:
        return reference, None
    if reference in results["orders"]:
        return reference, _step_at(results, reference, fraction)
    return "unpruned", _steps(results, next(iter(results["orders"])))[0]


def _perplexity_ratio(step: dict | None, other: dict | None) -> tuple[float, float, float] | None:
    """(ratio, low, high) of ``step``'s perplexity over ``other``'s on the same documents; None without per-document values."""
    if not (step and other and step.get("per_example") and other.get("per_example")):
        return None
    return paired_perplexity_ratio(step["per_example"]["nll"], other["per_example"]["nll"], step["per_example"]["tokens"])


def ratio_text(ratio: tuple[float, float, float]) -> str:
    """``-1.9% [-2.7, -1.0]``: a perplexity ratio and its interval as a change in percent."""
    mean, low, high = ratio
    return f"{100 * (mean - 1):+.1f}% [{100 * (low - 1):+.1f}, {100 * (high - 1):+.1f}]"


def paired_rows(passkey: dict[int, dict], perplexity: dict[int, dict], reference: str = "random") -> list[dict]:
    """Per (length, fraction, order): McNemar against ``reference`` at the same fraction on the same prompts (against the
    unpruned model where ``reference`` was not run), and the perplexity ratio to it on the same documents."""
    rows = []
    for length, results in sorted(passkey.items()):
        if not judged(results):
            rows.append({"length": length, "not_judged": not_judged_text(length, results)})
            continue
        ppl = perplexity.get(length)
        for order in (o for o in results["orders"] if o != reference):
            for step in _steps(results, order)[1:]:
                against, ref = _reference(results, reference, step["fraction"])
                row = {"length": length, "fraction": step["fraction"], "order": order, "against": against}
                row["mcnemar"] = mcnemar_exact(step["per_example"]["correct"], ref["per_example"]["correct"])
                mine = _step_at(ppl, order, step["fraction"]) if ppl and order in ppl["orders"] else None
                ratio = _perplexity_ratio(mine, _reference(ppl, reference, step["fraction"])[1]) if mine else None
                if ratio:
                    row["perplexity_ratio"] = ratio
                rows.append(row)
    return rows


def paired_table(passkey: dict[int, dict], perplexity: dict[int, dict], reference: str = "random") -> str:
    """Each order against ``reference`` (or the unpruned model): the prompts only one of the two retrieves, McNemar's p
    and its verdict after Bonferroni, and the perplexity ratio with its 95% interval."""
    rows = paired_rows(passkey, perplexity, reference)
    tests = sum(1 for r in rows if "mcnemar" in r)
    ppl_head, ppl_rule, ppl_empty = (" perplexity / the other's [95% interval] |", "---:|", " |") if perplexity else ("", "", "")
    lines = [
        f"| context | streamed | order | against | prompts only the order / only the other retrieves | McNemar p | passkey verdict "
        f"(p < {ALPHA:g}/{max(tests, 1)}) |" + ppl_head,
        "|---:|---:|---|---|---:|---:|---|" + ppl_rule,
    ]
    for row in rows:
        if "not_judged" in row:
            lines.append(f"| {row['length']:,} | | | | | | {row['not_judged']} |" + ppl_empty)
            continue
        test = row["mcnemar"]
        b, c, p = test["first_only"], test["second_only"], test["p_value"]
        verdict = ("better" if b > c else "worse") if p < ALPHA / tests else "no difference shown"
        ratio = row.get("perplexity_ratio")
        ppl = ratio_text(ratio) if ratio else "not measured"
        cells = [f"{row['length']:,}", f"{row['fraction']:.0%}", row["order"], row["against"], f"{b} / {c}", f"{p:.3g}", verdict]
        cells += [ppl] if perplexity else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def perplexity_rows(perplexity: dict[int, dict], reference: str = "random") -> list[dict]:
    """Per (length, fraction, order): the ratio of its perplexity to ``reference``'s (else the unpruned model's) on the same
    documents with its 95% interval; judged at every length, since perplexity needs no retrieval to show a cost."""
    rows = []
    for length, results in sorted(perplexity.items()):
        for order in (o for o in results["orders"] if o != reference):
            for step in _steps(results, order)[1:]:
                against, ref = _reference(results, reference, step["fraction"])
                ratio = _perplexity_ratio(step, ref)
                if ratio:
                    rows.append({"length": length, "fraction": step["fraction"], "order": order, "against": against, "ratio": ratio})
    return rows


def perplexity_paired_table(perplexity: dict[int, dict], reference: str = "random") -> str:
    """Each order's perplexity over ``reference``'s on the same documents, with its 95% interval and verdict."""
    lines = [
        "| context | documents | streamed | order | against | perplexity / the other's [95% interval] | verdict |",
        "|---:|---:|---:|---|---|---:|---|",
    ]
    for row in perplexity_rows(perplexity, reference):
        _, low, high = row["ratio"]
        verdict = "lower" if high < 1.0 else "higher" if low > 1.0 else "no difference shown"
        n = int(perplexity[row["length"]]["n_examples"])
        cells = [f"{row['length']:,}", str(n), f"{row['fraction']:.0%}", row["order"], row["against"], ratio_text(row["ratio"]), verdict]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
