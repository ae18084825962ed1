"""One settings dataclass per config group, a field per setting (values from conf/); ``RunSettings.of(cfg)`` builds the groups composed."""

from dataclasses import dataclass, fields

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError
from headprune.settings.analysis_groups import (
    AblateSettings,
    DynamicsSettings,
    ImportanceSettings,
    InspectSettings,
    KeepOneSettings,
    StudySettings,
)
from headprune.settings.declare import TRAINING, Group
from headprune.settings.measure_groups import ExportSettings, SpeedSettings
from headprune.settings.prune_groups import PruneSettings
from headprune.settings.run_groups import CallbacksSettings, LoggerSettings, RootSettings, TrainerSettings


def read_settings(cls, values, where: str):
    """``cls`` built from the config group ``values`` (a DictConfig or a dict) at ``where``; nested groups too."""
    data = OmegaConf.to_container(values, resolve=True) if OmegaConf.is_config(values) else dict(values)
    sections = {f.name: f.metadata.get("section") for f in fields(cls)}  # {setting: its nested group's dataclass, or None}
    missing = [name for name in sections if name not in data]
    if missing:
        raise ConfigError(f"{where} has no {', '.join(missing)}: the config group lost settings its conf/ file defines")
    return cls(
        **{name: read_settings(nested, data[name], f"{where}.{name}") if nested else data[name] for name, nested in sections.items()}
    )


def listed(value) -> list:
    """A setting that takes one value or a list, as a list (null: none)."""
    if value is None:
        return []
    return [value] if isinstance(value, (str, int, float, bool)) else list(value)


DECLARED = (
    Group("", RootSettings),
    Group("logger", LoggerSettings),
    Group("inspect", InspectSettings),
    Group("callbacks", CallbacksSettings, passes_on=(TRAINING,)),  # other callbacks by name
    Group("prune", PruneSettings),
    Group("speed", SpeedSettings),
    Group("importance", ImportanceSettings),
    Group("study", StudySettings),
    Group("ablate", AblateSettings),
    Group("keep_one", KeepOneSettings),
    Group("dynamics", DynamicsSettings),
    Group("trainer", TrainerSettings, passes_on=(TRAINING,)),  # Lightning's other Trainer arguments
    Group("export", ExportSettings),
)


@dataclass(frozen=True)
class RunSettings:
    """Every settings group the experiment composed (None where it composed none)."""

    prune: PruneSettings | None
    speed: SpeedSettings | None
    export: ExportSettings | None
    importance: ImportanceSettings | None
    dynamics: DynamicsSettings | None
    study: StudySettings | None

    @classmethod
    def of(cls, cfg) -> "RunSettings":
        """The settings of every group ``cfg`` holds, each read once."""
        return cls(**{name: read_settings(kind, cfg[name], name) if cfg.get(name) is not None else None for name, kind in GROUPS.items()})


GROUPS = {f.name: next(g.settings for g in DECLARED if g.name == f.name) for f in fields(RunSettings)}  # {group: its dataclass}
