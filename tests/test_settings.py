"""The settings dataclasses hold exactly the settings of their conf/ groups, read from the composed config."""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from pathlib import Path

import pytest
import yaml
from experiment_helpers import make_cfg
from omegaconf import open_dict

from headprune.core.checks import ConfigError
from headprune.settings import GROUPS, RunSettings, StudySettings

CONF = Path(__file__).resolve().parents[1] / "conf"


def field_names(cls) -> dict:
    """{name: nested names or None} of a settings dataclass."""
    return {f.name: field_names(f.metadata["section"]) if "section" in f.metadata else None for f in fields(cls)}


def yaml_names(values: dict) -> dict:
    return {
        k: yaml_names(v) if isinstance(v, dict) and k in ("lsq", "reconstruct", "finetune", "stream", "duo") else None
        for k, v in values.items()
    }


def composed_keys(group: str) -> dict:
    """The keys of conf/<group>/default.yaml with those the experiment files add to the group (dynamics.report_fraction)."""
    values = yaml.safe_load((CONF / group / "default.yaml").read_text())
    for path in sorted((CONF / "experiment").glob("*.yaml")):
        values = {**(yaml.safe_load(path.read_text()).get(group) or {}), **values}
    return values


@pytest.mark.parametrize("group", [g for g in GROUPS if g != "study"])
def test_each_settings_class_has_the_keys_of_its_conf_group(group):
    assert field_names(GROUPS[group]) == yaml_names(composed_keys(group))


def test_study_settings_have_the_keys_of_the_study_experiment():
    study = yaml.safe_load((CONF / "experiment" / "study.yaml").read_text())["study"]
    assert set(field_names(StudySettings)) == set(study)


def test_settings_read_the_composed_values_and_name_a_missing_one(tmp_path):
    cfg = make_cfg(tmp_path, "study", "nli", "prune.finetune.lr=0.5", "speed.max_seconds=3")
    settings = RunSettings.of(cfg)
    assert settings.prune.finetune.lr == 0.5 and settings.speed.max_seconds == 3 and settings.export is None
    assert all(is_dataclass(getattr(settings, g)) for g in ("prune", "speed", "importance", "study"))
    assert settings.prune.finetune.progress is cfg.prune.finetune.progress  # the YAML's value, not a Python fallback
    with open_dict(cfg):
        del cfg.speed.clock
    with pytest.raises(ConfigError, match="speed has no clock"):
        RunSettings.of(cfg)
