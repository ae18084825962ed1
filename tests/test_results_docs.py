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
