"""experiment=report: a run directory's results files and figures gathered into report.md and report.html."""

from pathlib import Path

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError
from headprune.viz.run_report import build_report, read_results, results_files


def run(cfg) -> dict:
    """Write ``<run_dir>/report.md`` (and report.html beside it): ``headprune experiment=report run_dir=outputs/...``."""
    path = build_report(cfg.run_dir)
    print(f"report written to {path} (and report.html beside it)")
    return {"report": str(path)}


def check(cfg) -> None:
    """A run directory that exists, whose results files are readable."""
    given = None if OmegaConf.is_missing(cfg, "run_dir") else cfg.get("run_dir")
    if not given or not Path(str(given)).expanduser().is_dir():
        raise ConfigError(f"run_dir={given} is not a directory: give a run directory (run_dir=outputs/<experiment>/<date>)")
    run_dir = Path(str(given)).expanduser()
    for file in results_files(run_dir):
        read_results(file, run_dir)
