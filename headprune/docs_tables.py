"""Render the tables of docs/results.md from committed results files, and check that they agree.

docs/results.md holds blocks ``<!-- BEGIN name -->`` ... ``<!-- END name -->``; each is rendered by
``TABLES[name]`` from the JSON files in docs/results/. ``python -m headprune.docs_tables`` rewrites
the blocks; tests/test_results_docs.py (``make check-results``) fails when they disagree.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from headprune.speed_verdict import is_inconclusive

BLOCK = re.compile(r"<!-- BEGIN (\w+) -->\n(.*?)<!-- END \1 -->", re.S)
MNLI_STUDY = "mnli_study"  # docs/results/mnli_study.json: ablate (eval + importance), keep_one, prune, speed
MT_STUDY = "mt_study"  # docs/results/mt_study.json: ablate (test + valid), keep_one, prune (orders and groups), speed
PAPER_SPEED = {1: 1.9, 4: 2.7, 16: 17.5, 64: 17.5}
PAPER_DYNAMICS = {1: 3.0, 2: 6.2, 3: 18.1, 5: 26.9, 10: 30.6, 20: 34.5, 30: 34.7, 40: 34.9}


def _load(results_dir: Path, name: str) -> dict:
    return json.loads((results_dir / f"{name}.json").read_text())


def _results(payload: dict) -> dict:
    return payload.get("results", payload)


def _stage(payload: dict, name: str) -> dict:
    """A study's stage ``name`` (ablate, keep_one, prune, speed), or the numbers of a run of that experiment alone."""
    results = _results(payload)
    return results.get(name, results)


def _signed(value, digits=2) -> str:
    return f"{value:+.{digits}f}"


# ---- single-head ablation ---------------------------------------------------------------------
def ablation_table(study: dict, split: str = "eval") -> str:
    abl = _stage(study, "ablate")["splits"][split]
    lines = ["| group | heads | not significant | significantly worse | significantly better | largest drop | largest gain |",
             "|---|---|---|---|---|---|---|"]
    for group, g in abl["per_group"].items():
        not_sig = g["heads"] - g["significant"]
        lines.append(f"| {group} | {g['heads']} | {not_sig} ({100 * not_sig / g['heads']:.0f}%) | {g['significant_worse']} | "
                     f"{g['significant_better']} | {g['max_drop'] + 0.0:.2f} | {g['max_gain'] + 0.0:.2f} |")
    boot = abl["bootstrap"]
    lines.append("")
    lines.append(f"Base {abl['metric']} {abl['base_score']:.2f} on {abl['n_examples']} examples of `{abl['split']}`; "
                 f"{boot['test']}, {boot['n_samples']} resamples, p < {boot['alpha']}, seed {boot['seed']}.")
    return "\n".join(lines)


# ---- keep one head per layer --------------------------------------------------------------------
def keep_one_table(study: dict) -> str:
    k = _stage(study, "keep_one")
    lines = ["| group | layer | best head (chosen on selection split) | score | change | p | significant |", "|---|---|---|---|---|---|---|"]
    for r in k["rows"]:
        lines.append(f"| {r['group']} | {r['layer'] + 1} | {r['best_head'] + 1} | {r['score']:.2f} | {_signed(r['delta'])} | "
                     f"{r['p_value']:.3f} | {'yes' if r['significant'] else 'no'} |")
    lines.append("")
    lines.append(f"Base {k['metric']} {k['base_score']:.2f} on {k['n_examples']} examples of `{k['split']}`; "
                 f"heads chosen on `{k['selection_split']}` (base {k['selection_base_score']:.2f}).")
    return "\n".join(lines)


# ---- greedy pruning -----------------------------------------------------------------------------
def prunable(steps: list[dict], base: float, tolerance: float) -> float:
    """The largest fraction up to which every step stays within ``tolerance`` of the unpruned score."""
    best = 0.0
    for step in steps:
        if step["score"] < base - tolerance:
            break
        best = step["fraction"]
    return best


def _curves_table(first_column: str, curves: dict[str, list[dict]], tolerance: float, unit: str) -> str:
    """Score at each fraction, one column per curve, and the largest fraction within ``tolerance`` of unpruned."""
    names = list(curves)
    lines = [f"| {first_column} | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for index, step in enumerate(curves[names[0]]):
        lines.append(f"| {100 * step['fraction']:.0f}% | " + " | ".join(f"{curves[n][index]['score']:.2f}" for n in names) + " |")
    lines.append(f"| **prunable with < {tolerance:g} {unit} loss** | "
                 + " | ".join(f"{100 * prunable(curves[n], curves[n][0]['score'], tolerance):.0f}%" for n in names) + " |")
    return "\n".join(lines)


def prune_table(study: dict, tolerance: float = 1.0, unit: str = "point") -> str:
    """Greedy pruning, one column per order (paper Figure 2)."""
    orders = _stage(study, "prune")["orders"]
    return _curves_table("heads pruned", {name: curve["steps"] for name, curve in orders.items()}, tolerance, unit)


def study_groups_table(study: dict, tolerance: float = 1.0) -> str:
    """A study's importance-order pruning of all groups and of each group alone (paper Figures 2 and 3)."""
    p = _stage(study, "prune")
    curves = {"all groups": p["orders"]["importance"]["steps"],
              **{f"{g} only": v["orders"]["importance"]["steps"] for g, v in p["by_group"].items()}}
    return _curves_table("share of the pruned heads' group(s) removed", curves, tolerance, "BLEU")


# ---- speed ----------------------------------------------------------------------------------------
def speed_table(study: dict) -> str:
    s = _stage(study, "speed")
    lines = ["| batch | original ex/s | pruned ex/s | gain | FLOP-ideal gain | measured / ideal | paper gain (BERT-base, GPU) |",
             "|---|---|---|---|---|---|---|"]
    for r in s["rows"]:
        o, q = r["original"], r["pruned"]
        noise = is_inconclusive(r)
        ratio = "n/a" if r.get("gain_vs_ideal") is None or noise else f"{100 * r['gain_vs_ideal']:.0f}%"
        gain = "inconclusive" if noise else f"{100 * r['gain']:+.1f}%"
        paper = PAPER_SPEED.get(r["batch_size"])
        lines.append(f"| {r['batch_size']} | {o['examples_per_s']:.1f} +- {o['spread']:.1f} | {q['examples_per_s']:.1f} +- {q['spread']:.1f} | "
                     f"{gain} | {100 * r['flop_ideal_gain']:+.1f}% | {ratio} | {'+' if paper else ''}{paper if paper else 'n/a'}% |")
    cost = s["cost"]
    check = s["score_check"]
    lines.append("")
    lines.append(f"{s['heads_pruned']} of {s['heads_total']} heads removed on `{s['device']}`; parameters "
                 f"{cost['original']['parameters']:,} -> {cost['pruned']['parameters']:,}, attention FLOPs "
                 f"{cost['original']['attention_flops']:,} -> {cost['pruned']['attention_flops']:,} per example; "
                 f"masked score {check['masked']:.2f}, pruned score {check['pruned']:.2f} (equal: {check['equal']}).")
    return "\n".join(lines)


# ---- training dynamics --------------------------------------------------------------------------
def dynamics_table(dynamics: dict, at: float = 0.4) -> str:
    lines = ["| epoch | unpruned BLEU | BLEU at 40% pruned | relative | prunable (< 1 BLEU) | rank stability | paper unpruned BLEU |",
             "|---|---|---|---|---|---|---|"]
    for s in dynamics["snapshots"]:
        index = min(range(len(s["fractions"])), key=lambda i: abs(s["fractions"][i] - at))
        epoch = s["epoch"] + 1
        stab = "" if s.get("rank_stability") is None else f"{s['rank_stability']:.2f}"
        paper = PAPER_DYNAMICS.get(epoch)
        lines.append(f"| {epoch} | {s['unpruned']:.2f} | {s['scores'][index]:.2f} | {100 * s['relative'][index]:.0f}% | "
                     f"{100 * s['prunable_fraction']:.0f}% | {stab} | {paper if paper is not None else 'n/a'} |")
    return "\n".join(lines)


def _correlation_sentence(c: dict, first: str, second: str, tail: str) -> str:
    return (f"Pearson r = {c['pearson_r']:.2f} (p = {c['p_value']:.3g}) between the per-head ablation differences on "
            f"`{first}` and `{second}` ({tail}).")


def correlation_line(study: dict) -> str:
    c = _stage(study, "ablate").get("correlation")
    if not c:
        return "No second evaluation set was ablated."
    return _correlation_sentence(c, c["splits"][0], c["splits"][1],
                                 "paper: 0.68 MNLI matched vs mismatched, 0.56 newstest2013 vs MTNT")


def cross_file_correlation_line(first: dict, first_split: str, second: dict, second_split: str, sizes: str) -> str:
    """Pearson r between the per-head ablation differences of two result files (paper section 3.4)."""
    from headprune.experiments.ablate import correlation

    c = correlation(_stage(first, "ablate")["splits"][first_split], _stage(second, "ablate")["splits"][second_split])
    return _correlation_sentence(c, first_split, second_split, sizes)


TABLES = {
    "mnli_ablation": lambda d: ablation_table(_load(d, MNLI_STUDY)),
    "mnli_ablation_heldout": lambda d: ablation_table(_load(d, MNLI_STUDY), split="importance"),
    "mnli_ablation_full_dev": lambda d: ablation_table(_load(d, "mnli_ablate_full_dev")),
    "mnli_correlation_full_dev": lambda d: cross_file_correlation_line(
        _load(d, "mnli_ablate_full_dev"), "eval", _load(d, MNLI_STUDY), "importance",
        "all 9,815 dev-matched examples vs the 500 held-out training examples"),
    "mnli_correlation": lambda d: correlation_line(_load(d, MNLI_STUDY)),
    "mnli_keep_one": lambda d: keep_one_table(_load(d, MNLI_STUDY)),
    "mnli_prune": lambda d: prune_table(_load(d, MNLI_STUDY)),
    "mnli_prune_full_dev": lambda d: prune_table(_load(d, "mnli_prune_full_dev")),
    "mnli_speed": lambda d: speed_table(_load(d, MNLI_STUDY)),
    "mt_ablation": lambda d: ablation_table(_load(d, MT_STUDY)),
    "mt_ablation_heldout": lambda d: ablation_table(_load(d, MT_STUDY), split="heldout"),
    "mt_keep_one": lambda d: keep_one_table(_load(d, MT_STUDY)),
    "mt_prune": lambda d: prune_table(_load(d, MT_STUDY), unit="BLEU"),
    "mt_prune_groups": lambda d: study_groups_table(_load(d, MT_STUDY)),
    "mt_correlation": lambda d: correlation_line(_load(d, MT_STUDY)),
    "mt_dynamics": lambda d: dynamics_table(_load(d, "mt_dynamics")),
}


def render_blocks(markdown: str, results_dir: Path) -> str:
    """The markdown with every known block re-rendered from the results files."""
    def replace(match):
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"docs block {name!r} has no renderer in headprune/docs_tables.py")
        return f"<!-- BEGIN {name} -->\n{TABLES[name](results_dir)}\n<!-- END {name} -->"

    return BLOCK.sub(replace, markdown)


def blocks(markdown: str) -> dict[str, str]:
    """{name: body} of the blocks in a markdown text."""
    return {m.group(1): m.group(2) for m in BLOCK.finditer(markdown)}


def main(argv=None) -> None:
    argv = argv or sys.argv[1:]
    doc = Path(argv[0] if argv else "docs/results.md")
    results_dir = Path(argv[1]) if len(argv) > 1 else doc.parent / "results"
    doc.write_text(render_blocks(doc.read_text(), results_dir))
    print(f"rendered {len(blocks(doc.read_text()))} blocks of {doc} from {results_dir}")


if __name__ == "__main__":
    main()
