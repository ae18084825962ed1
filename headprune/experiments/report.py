"""experiment=report: a run directory's results files and figures gathered into report.md and report.html."""

from headprune.viz import run_report


def run(cfg) -> dict:
    """Write ``<run_dir>/report.md`` (and report.html beside it)."""
    return run_report.run(cfg)


def check(cfg) -> None:
    """A run directory that exists, whose results files are readable."""
    run_report.check(cfg)
