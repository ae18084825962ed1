"""Gather a run directory's results into one report.md (and report.html) readable without W&B."""

from pathlib import Path

from headprune.core.checks import ConfigError
from headprune.results.writer import read_json, write_text_atomic
from headprune.viz.tables import markdown_sections


def results_files(run_dir: Path) -> list[Path]:
    files = sorted(run_dir.rglob("results.json")) + sorted(run_dir.rglob("dynamics.json"))
    return [f for f in files if "wandb" not in f.parts]


def read_results(file: Path, run_dir: Path) -> dict:
    """One results file of ``run_dir`` as a JSON object, or a ConfigError naming run_dir and the file (an input: never deleted)."""
    try:
        payload = read_json(file, "the report only reads it: restore it from a copy, or run again the experiment that wrote it")
    except ValueError as err:
        raise ConfigError(f"run_dir={run_dir}: {err}") from None
    if not isinstance(payload, dict):
        raise ConfigError(f"run_dir={run_dir}: {file} holds a JSON {type(payload).__name__}, not the object a headprune run writes")
    return payload


def build_report(run_dir: str | Path) -> Path:
    """Write ``report.md`` and ``report.html`` into ``run_dir`` from its results files and PNG figures."""
    run_dir = Path(run_dir)  # a directory: experiment=report checks run_dir before work
    files = results_files(run_dir)
    figures = sorted(p for p in run_dir.rglob("*.png") if "wandb" not in p.parts)
    if not files and not figures:
        raise FileNotFoundError(f"{run_dir} holds no results.json, dynamics.json or PNG figures to report")
    lines = [f"# headprune report: {run_dir.name}", "", f"Run directory: `{run_dir}`", ""]
    for file in files:
        payload = read_results(file, run_dir)
        lines += [f"## {payload.get('experiment', file.stem)} (`{file.relative_to(run_dir)}`)", ""]
        if payload.get("fingerprints"):
            lines += ["Fingerprints: " + ", ".join(f"{k}={v}" for k, v in payload["fingerprints"].items()), ""]
        numbers = (payload.get("results") or {}).items()  # its scalar numbers as bullets
        lines += [f"- **{key}**: {value}" for key, value in numbers if isinstance(value, (int, float, str, bool)) or value is None] + [""]
        lines += markdown_sections(payload)
    if figures:
        lines += ["## Figures", ""]
        for fig in figures:
            lines += [f"### {fig.stem}", "", f"![{fig.stem}]({fig.relative_to(run_dir).as_posix()})", ""]
    md_path = write_text_atomic(run_dir / "report.md", "\n".join(lines))
    write_text_atomic(run_dir / "report.html", _html(lines))
    return md_path


def _html(lines: list[str]) -> str:
    """report.md rendered to a self-contained HTML page by markdown-it-py (CommonMark with GFM tables)."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render("\n".join(lines))
    style = (
        "body{font-family:sans-serif;max-width:1000px;margin:2em auto}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:2px 6px}img{max-width:900px}"
    )
    return f"<!doctype html><html><head><meta charset='utf-8'><style>{style}</style></head><body>{body}</body></html>"
