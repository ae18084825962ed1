"""Every experiment owns its check: each module with a ``run`` has a ``check`` beside it, and validate dispatches to it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from experiment_helpers import compose_cfg

PACKAGE = Path(__file__).resolve().parents[1] / "headprune"
ENTRY_MODULES = sorted((PACKAGE / "experiments").glob("*.py"))


def top_level_functions(path: Path) -> set[str]:
    return {node.name for node in ast.parse(path.read_text()).body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("path", [p for p in ENTRY_MODULES if "run" in top_level_functions(p)], ids=lambda p: p.stem)
def test_every_experiment_has_its_own_check(path):
    assert "check" in top_level_functions(path), f"{path.name} has a run but no check(cfg) beside it"


def test_every_experiment_file_names_a_run_with_a_check():
    """Each conf/experiment/*.yaml names an entry point that validate can dispatch (a module check or a task's trainer)."""
    from headprune.checks.shared_checks import experiment_files
    from headprune.validation import check_of

    for run, (name, _) in experiment_files().items():
        assert callable(check_of({"run": run})), name


def test_an_unknown_run_is_refused(tmp_path):
    from omegaconf import open_dict

    from headprune.core.checks import ConfigError
    from headprune.validation import validate

    for run in ("headprune.sources.orders.run", "headprune.experiments.nothing.run", "headprune.settings.schema.SCHEMA"):
        cfg = compose_cfg(tmp_path, ["experiment=inspect", "model=tiny_bert", "logger=none"])
        with open_dict(cfg):
            cfg.run = run
        with pytest.raises(ConfigError, match="no experiment headprune knows"):
            validate(cfg)


def test_the_data_directory_is_beside_the_project_wherever_headprune_starts(tmp_path, monkeypatch):
    """paths.data_dir: HEADPRUNE_DATA_DIR, else ../shared/data next to the directory holding conf/ (not the working directory)."""
    from hydra import compose, initialize_config_dir

    from headprune.conf_dir import config_dir, project_dir

    monkeypatch.delenv("HEADPRUNE_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=ablate", "model=tiny_bert"])
    assert Path(cfg.paths.data_dir).resolve() == (Path(config_dir()).parent / ".." / "shared" / "data").resolve()
    assert Path(project_dir()) == Path(config_dir()).parent
    monkeypatch.setenv("HEADPRUNE_DATA_DIR", str(tmp_path / "mine"))
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=["experiment=ablate", "model=tiny_bert"])
    assert cfg.data.dir == f"{tmp_path / 'mine'}/mnli"
