"""Every table in docs/results.md is what the committed results files say (make check-results)."""
from pathlib import Path

import pytest

from headprune.docs_tables import TABLES, blocks, render_blocks

DOCS = Path(__file__).resolve().parent.parent / "docs"


def test_results_tables_agree_with_result_files():
    doc = DOCS / "results.md"
    if not doc.exists():
        pytest.skip("docs/results.md not written yet")
    text = doc.read_text()
    found = blocks(text)
    assert found, "docs/results.md has no generated blocks"
    unknown = set(found) - set(TABLES)
    assert not unknown, f"blocks without a renderer: {unknown}"
    assert blocks(render_blocks(text, DOCS / "results")) == found, "a table in docs/results.md disagrees with docs/results/*.json"


@pytest.mark.parametrize("study", ["mnli_study", "mt_study"])
def test_a_study_report_shows_the_docs_tables(tmp_path, study):
    """report.md of a study's run directory holds the same tables as docs/results.md (one renderer)."""
    import shutil

    from headprune.docs_tables import TABLES
    from headprune.report import build_report

    source = DOCS / "results" / f"{study}.json"
    if not source.exists():
        pytest.skip(f"{source.name} not committed")
    shutil.copy(source, tmp_path / "results.json")
    report = build_report(tmp_path).read_text()
    prefix = "mnli_" if study == "mnli_study" else "mt_"
    names = [n for n in TABLES if n.startswith(prefix) and "full_dev" not in n and n != "mt_dynamics"]
    assert names
    for name in names:
        assert TABLES[name](DOCS / "results") in report, name
