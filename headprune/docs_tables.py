"""Render the tables of docs/results.md from committed results files, and check that they agree.

docs/results.md holds blocks ``<!-- BEGIN name -->`` ... ``<!-- END name -->``; each is rendered by
``TABLES[name]`` (a renderer of headprune.render) from the JSON files in docs/results/. ``python -m headprune.docs_tables`` rewrites
the blocks; tests/test_results_docs.py (``make check-results``) fails when they disagree.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from headprune.render import (ablation_table, correlation_line, cross_file_correlation_line, dynamics_table, keep_one_table,
                              pareto_table, prune_table, speed_table, study_groups_table)

BLOCK = re.compile(r"<!-- BEGIN (\w+) -->\n(.*?)<!-- END \1 -->", re.S)
MNLI_STUDY = "mnli_study"  # docs/results/mnli_study.json: ablate (eval + importance), keep_one, prune, speed
MT_STUDY = "mt_study"  # docs/results/mt_study.json: ablate (test + valid), keep_one, prune (orders and groups), speed
PAPER_DYNAMICS = {1: 3.0, 2: 6.2, 3: 18.1, 5: 26.9, 10: 30.6, 20: 34.5, 30: 34.7, 40: 34.9}  # the paper's unpruned BLEU per epoch


def _load(results_dir: Path, name: str) -> dict:
    return json.loads((results_dir / f"{name}.json").read_text())


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
    "pareto_mnli": lambda d: pareto_table(_load(d, "mnli_pareto")),  # docs/results/mnli_pareto.json: a prune-for-speed run
    "mt_ablation": lambda d: ablation_table(_load(d, MT_STUDY)),
    "mt_ablation_heldout": lambda d: ablation_table(_load(d, MT_STUDY), split="heldout"),
    "mt_keep_one": lambda d: keep_one_table(_load(d, MT_STUDY)),
    "mt_prune": lambda d: prune_table(_load(d, MT_STUDY), unit="BLEU"),
    "mt_prune_groups": lambda d: study_groups_table(_load(d, MT_STUDY)),
    "mt_correlation": lambda d: correlation_line(_load(d, MT_STUDY)),
    "mt_dynamics": lambda d: dynamics_table(_load(d, "mt_dynamics"), paper=PAPER_DYNAMICS),
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
