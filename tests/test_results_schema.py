"""Results files before schema version 2 (heads_pruned, heads_total, total_heads) read as the current ones do."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from docs_tables import TABLES

from headprune.results.writer import SCHEMA_VERSION
from headprune.viz.tables import markdown_sections

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "results"
OLD_KEYS = {
    "heads_pruned": "units_removed",
    "heads_total": "units_total",
    "total_heads": "units_total",
    "query_heads_pruned": "query_heads_removed",
}


def current_keys(value):
    """A version-1 payload with every record's keys as version 2 writes them."""
    if isinstance(value, dict):
        return {OLD_KEYS.get(k, k): current_keys(v) for k, v in value.items()}
    return [current_keys(v) for v in value] if isinstance(value, list) else value


@pytest.fixture(scope="module")
def current_dir(tmp_path_factory):
    """docs/results/ with every results file rewritten in the current keys."""
    out = tmp_path_factory.mktemp("results")
    for path in RESULTS.iterdir():
        if path.suffix == ".json":
            (out / path.name).write_text(json.dumps(current_keys(json.loads(path.read_text()))))
        else:
            shutil.copy(path, out / path.name)
    return out


def test_the_committed_results_are_old_files():
    old = [p.name for p in RESULTS.glob("*.json") if json.loads(p.read_text()).get("schema_version") == 1]
    assert SCHEMA_VERSION == 2 and any("heads_pruned" in (RESULTS / name).read_text() for name in old)


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_docs_table_is_the_same_from_old_and_current_keys(table, current_dir):
    assert TABLES[table](RESULTS) == TABLES[table](current_dir)


@pytest.mark.parametrize("name", ["lm_prune_head", "lm_speed_kv_group", "mnli_study", "mt_study"])
def test_a_report_is_the_same_from_old_and_current_keys(name):
    old = json.loads((RESULTS / f"{name}.json").read_text())
    assert markdown_sections(old) == markdown_sections(current_keys(old))
