"""Every table in docs/results*.md, and the README's results, is what the committed results files say (make check-results)."""

import json
from pathlib import Path

import pytest
from docs_tables import BLOCK, DOCS_WITH_TABLES, TABLES, blocks, render_blocks

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"


@pytest.mark.parametrize("name", DOCS_WITH_TABLES)
def test_results_tables_agree_with_result_files(name):
    doc = ROOT / name
    if not doc.exists():
        pytest.skip(f"{name} not written yet")
    text = doc.read_text()
    found = blocks(text)
    assert found, f"{name} has no generated blocks"
    unknown = set(found) - set(TABLES)
    assert not unknown, f"blocks without a renderer: {unknown}"
    assert blocks(render_blocks(text, DOCS / "results")) == found, f"a table in {name} disagrees with docs/results/*.json"


def test_the_readme_results_are_rendered():
    """README.md's "Results" bullets are the readme_results block, one bullet per renderer."""
    from readme_results import BULLETS

    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Results") :].split("\n## ")[1]  # to the next section or the end
    rendered = blocks(section).get("readme_results")
    assert rendered is not None, "README.md's Results section has no readme_results block"
    outside = BLOCK.sub("", section)
    assert not [line for line in outside.splitlines() if line.startswith("- ")], "a results bullet outside the rendered block"
    assert sum(line.startswith("- ") for line in rendered.splitlines()) == len(BULLETS)


@pytest.mark.parametrize("study", ["mnli_study", "mt_study"])
def test_a_study_report_shows_the_docs_tables(tmp_path, study):
    """report.md of a study's run directory holds the same tables as docs/results.md (one renderer)."""
    import shutil

    from docs_tables import TABLES

    from headprune.viz.run_report import build_report

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


def _markdown_tables(text: str) -> list[list[list[str]]]:
    """Every pipe table of a markdown text as rows of cell texts (the |---| separator row left out)."""
    tables, current = [], []
    for line in text.splitlines() + [""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                current.append(cells)
        elif current:
            tables.append(current)
            current = []
    return tables


def _html_tables(page: str) -> list[list[list[str]]]:
    """Every <table> of an HTML page as rows of cell texts, read by the standard library's HTML parser."""
    from html.parser import HTMLParser

    class Tables(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tables, self.cell = [], None

        def handle_starttag(self, tag, attrs):
            if tag == "table":
                self.tables.append([])
            elif tag == "tr":
                self.tables[-1].append([])
            elif tag in ("td", "th"):
                self.cell = ""

        def handle_endtag(self, tag):
            if tag in ("td", "th"):
                self.tables[-1][-1].append(self.cell.strip())
                self.cell = None

        def handle_data(self, data):
            if self.cell is not None:
                self.cell += data

    parser = Tables()
    parser.feed(page)
    return parser.tables


def test_report_html_has_the_tables_of_report_md(tmp_path):
    """report.html shows each table of report.md with the same rows and cells (no separator row, nothing flattened)."""
    import shutil

    from headprune.viz.run_report import build_report

    source = DOCS / "results" / "mnli_study.json"
    if not source.exists():
        pytest.skip(f"{source.name} not committed")
    shutil.copy(source, tmp_path / "results.json")
    markdown = build_report(tmp_path).read_text()
    expected = _markdown_tables(markdown)
    assert len(expected) >= 3
    found = _html_tables((tmp_path / "report.html").read_text())

    def plain(table):  # markdown emphasis and code marks are rendered, not shown
        return [[c.replace("**", "").replace("`", "") for c in row] for row in table]

    assert [plain(t) for t in found] == [plain(t) for t in expected]


def test_committed_results_name_no_machine_path():
    """docs/results/*.json keep paths relative to the project (tools/publish_run.py writes them so)."""
    from publish_run import absolute_paths

    found = {p.name: absolute_paths(p.read_text()) for p in sorted((DOCS / "results").glob("*.json"))}
    assert not {name: paths for name, paths in found.items() if paths}, "run python tools/publish_run.py --fix"


def test_publishing_makes_checkout_paths_relative():
    from publish_run import absolute_paths, relative_paths

    payload = {"data": {"dir": "/work/clone/../shared/data"}, "model": "/home/me/headprune/outputs/run/model", "name": "outputs"}
    text = relative_paths(json.dumps(payload))
    assert json.loads(text) == {"data": {"dir": "../shared/data"}, "model": "outputs/run/model", "name": "outputs"}
    assert absolute_paths(json.dumps(payload)) and not absolute_paths(text)


def test_units_table_shows_what_each_point_keeps_and_refuses_another_onnx_model():
    """A unit run's row: heads and neurons kept from its mask, drops against the control in each runtime; an ONNX model
    that keeps other widths than the point's mask is refused."""
    from units_table import units_deploy_table

    mask = {"enc_self": [[1, 0], [1, 1]], "enc_ffn": [[1, 0, 0], [1, 1, 0]]}
    points = [
        {"order": "unpruned", "recovery": "none", "step": "0%", "score": 60.0},
        {"order": "unpruned", "recovery": "finetune", "control": True, "step": "0%", "score": 63.0},
        {"order": "fisher", "recovery": "finetune", "step": "speedup=1.8", "score": 62.5, "predicted_speedup": 1.8, "mask": mask},
    ]
    run = {"results": {"unit": "head+ffn", "split": "eval", "n_examples": 100, "points": points}}

    def model(heads, neurons, scores):
        torch_score, f32, int8_1, int8_64 = scores
        return {
            "heads": heads,
            "neurons": neurons,
            "accuracy": {"torch": torch_score, "onnx f32": {"64": f32}, "onnx int8": {"1": int8_1, "64": int8_64}},
        }

    onnx = {
        "models": {
            "unpruned": model(4, 6, (60.0, 60.0, 59.5, 60.5)),
            "control": model(4, 6, (63.0, 63.0, 62.8, 62.6)),
            "joint": model(3, 3, (62.5, 62.5, 62.0, 62.1)),
        }
    }
    table = units_deploy_table({"both": (run, "joint")}, onnx)
    (row,) = [line for line in table.splitlines() if line.startswith("| both")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:4] == ["both: fisher+finetune@speedup=1.8", "3", "3", "1.80x"]
    assert cells[-2:] == ["63.00", "-0.50 / -0.50 / -0.50"]
    onnx["models"]["joint"]["neurons"] = 4
    with pytest.raises(ValueError, match="keeps 3 heads / 4 neurons"):
        units_deploy_table({"both": (run, "joint")}, onnx)


def test_units_speed_table_gives_each_runtime_its_gains_over_both_references():
    """A model's row per runtime: examples/s and the paired gains over unpruned PyTorch and unpruned ONNX int8; the
    unpruned model's rows give the first only, an inconclusive gain says so."""
    from units_table import units_speed_table

    def cell(rate, vs_torch, vs_int8, verdict="confident"):
        gain = lambda g: {"gain": g, "gain_interval": [g - 0.01, g + 0.01], "verdict": verdict}  # noqa: E731
        return {"examples_per_s": rate, "vs unpruned torch": gain(vs_torch), "vs unpruned onnx int8": gain(vs_int8)}

    runtimes = {
        "unpruned torch": cell(50.0, 0.0, -0.5),
        "unpruned onnx f32": cell(80.0, 0.6, -0.2, verdict="inconclusive"),
        "unpruned onnx int8": cell(100.0, 1.0, 0.0),
        "ffn torch": cell(85.0, 0.7, -0.15),
        "ffn onnx f32": cell(130.0, 1.6, 0.3),
        "ffn onnx int8": cell(160.0, 2.2, 0.6),
    }
    table = units_speed_table({"throughput": {"64": runtimes}}, {"unpruned": "unpruned", "ffn": "FFN neurons"})
    rows = {tuple(c.strip() for c in line.strip("|").split("|"))[:2]: line for line in table.splitlines()[2:]}
    assert rows[("unpruned", "PyTorch")].endswith("| 50.0 |  |  |") and rows[("unpruned", "ONNX int8")].endswith("|  |")
    assert "+60.0% [+59.0, +61.0] (inconclusive)" in rows[("unpruned", "ONNX f32")]
    assert "| 85.0 | +70.0% [+69.0, +71.0] | -15.0% [-16.0, -14.0] |" in rows[("FFN neurons", "PyTorch")]


def _stream_results(base: float, steps: dict[str, list[tuple[float, float, list[list[int]]]]]) -> dict:
    """A streaming run's results: 2 layers x 2 KV groups, each order's (fraction, score, mask) steps."""
    return {
        "base_score": base,
        "units_total": 4,
        "orders": {
            order: {"steps": [{"fraction": f, "score": s, "kv_fraction": 1 - f / 2, "mask": {"dec_self": m}} for f, s, m in rows]}
            for order, rows in steps.items()
        },
    }


def test_long_context_largest_fraction_and_overlap_read_the_curves():
    """The largest fraction within a point (accuracy) or 1% (perplexity) skips a worse step before a better one; the
    overlap counts the KV groups two orders keep full at the same fraction."""
    from long_context_tables import largest_within, overlap_table

    half, quarter = [[1, 0], [1, 0]], [[1, 0], [0, 0]]
    passkey = _stream_results(
        80.0, {"duo": [(0.5, 79.5, half), (0.75, 70.0, quarter)], "random": [(0.5, 78.0, [[0, 1], [1, 0]]), (0.75, 79.2, quarter)]}
    )
    assert largest_within(passkey, "duo", points=1.0) == 0.5 and largest_within(passkey, "random", points=1.0) == 0.75
    ppl = _stream_results(10.0, {"duo": [(0.5, 10.09, half), (0.75, 10.2, quarter)]})
    assert largest_within(ppl, "duo", relative=0.01) == 0.5
    rows = overlap_table(passkey).splitlines()
    assert rows[2] == "| 50% | 2 | 1 (50%) | 50% |" and rows[3] == "| 75% | 1 | 1 (100%) | 25% |"


def test_long_context_runs_of_merge_parts_of_the_same_prompts(tmp_path):
    """Two runs of the same prompts with other orders read as one; runs of other prompts are refused."""
    from long_context_tables import runs_of

    half = [[1, 0], [1, 0]]
    a = {**_stream_results(80.0, {"duo": [(0.5, 79.5, half)]}), "n_examples": 6}
    b = {**_stream_results(80.0, {"random": [(0.5, 70.0, half)]}), "n_examples": 6}
    for name, results in (("x_4096_a", a), ("x_4096_b", b), ("x_1024", a)):
        (tmp_path / f"{name}.json").write_text(json.dumps({"results": results}))
    runs = runs_of(tmp_path, "x")
    assert sorted(runs) == [1024, 4096] and list(runs[4096]["orders"]) == ["duo", "random"]
    (tmp_path / "x_4096_b.json").write_text(json.dumps({"results": {**b, "base_score": 60.0}}))
    with pytest.raises(ValueError, match="runs of other prompts cannot be merged"):
        runs_of(tmp_path, "x")
