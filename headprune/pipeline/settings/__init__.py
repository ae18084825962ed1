"""One settings dataclass per config group, built once from the composed config and read by attribute.

The values (and so every default) come from ``conf/``: the dataclasses have no defaults of their own, and a
group that lacks one of their fields is a ConfigError naming it. ``RunSettings.of(cfg)`` builds every group
the experiment composed (None for the others).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError


def section(cls):
    """A field holding a nested settings group (e.g. ``prune.finetune``); read from conf/ like every other field."""
    return field(metadata={"section": cls})


def read_settings(cls, values, where: str):
    """``cls`` built from the config group ``values`` (a DictConfig or a dict) at ``where``; nested groups too."""
    data = OmegaConf.to_container(values, resolve=True) if OmegaConf.is_config(values) else dict(values)
    missing = [f.name for f in fields(cls) if f.name not in data]
    if missing:
        raise ConfigError(f"{where} has no {', '.join(missing)}: the config group lost settings its conf/ file defines")
    built = {}
    for f in fields(cls):
        nested = f.metadata.get("section")
        built[f.name] = read_settings(nested, data[f.name], f"{where}.{f.name}") if nested else data[f.name]
    return cls(**built)


def listed(value) -> list:
    """A setting that takes one value or a list, as a list (null: none)."""
    if value is None:
        return []
    return [value] if isinstance(value, (str, int, float, bool)) else list(value)


@dataclass(frozen=True)
class LsqSettings:
    """prune.lsq: the least-squares recovery."""

    ridge: float
    max_scale: float


@dataclass(frozen=True)
class FinetuneSettings:
    """prune.finetune: the fine-tune recovery."""

    max_steps: int
    lr: float
    distill_weight: float
    temperature: float
    examples: int | None
    tokens: int | None
    seed: int
    warmup: float
    decay: bool
    lora_rank: int | None
    lora_alpha: float | None
    progress: bool


@dataclass(frozen=True)
class PruneSettings:
    """prune: greedy pruning and pruning for speed (conf/prune/default.yaml)."""

    unit: str
    order: Any  # a name or a list of names
    layout: str
    reestimate: bool
    step: float
    max_fraction: float
    fractions: Any  # null, a number or a list
    groups: list
    min_heads_per_layer: int
    split: str
    ablation_split: str
    n_samples: int
    target: Any  # {speedup, flops, max_drop}, at most one set
    schedule: Any  # null or a list of fractions or targets
    cost: str
    seq_len: int
    latency_batch_size: int
    recover: Any  # a name or a list of names
    rearrange: Any  # false | true | both
    recover_examples: int
    control: bool
    extra_splits: list
    selection_split: str | None
    measure_speed: bool
    save: Any  # recovered | all | none, or a list of point names
    lsq: LsqSettings = section(LsqSettings)
    finetune: FinetuneSettings = section(FinetuneSettings)


@dataclass(frozen=True)
class SpeedSettings:
    """speed: physical pruning and throughput (conf/speed/default.yaml)."""

    fraction: float
    mask_file: str | None
    mask_order: str
    mask_step: str | None
    point: str | None
    batch_sizes: list
    examples: int
    warmup: int
    repeats: int
    max_repeats: int
    max_seconds: float
    tolerance: float
    split: str
    check_score: bool
    clock: str
    runtime: str


@dataclass(frozen=True)
class ExportSettings:
    """export: a pruned model out of headprune (conf/export/default.yaml)."""

    format: str
    mask_file: str | None
    mask_order: str
    mask_step: str | None
    fraction: float
    model: str | None
    point: str | None
    quantize: str
    per_channel: bool
    int8_batch_sizes: list
    gguf_dtype: str
    tokenizer_pre: str | None
    int8_batch_sizes: list[int]
    split: str
    examples: int
    batch_size: int
    new_tokens: int
    tolerance: float


@dataclass(frozen=True)
class ImportanceSettings:
    """importance: the head-importance estimator (conf/importance/default.yaml)."""

    reduce: str
    normalize_layers: bool
    normalize_global: bool


@dataclass(frozen=True)
class DynamicsSettings:
    """dynamics: a training-dynamics snapshot (conf/dynamics/default.yaml; experiment=dynamics adds report_fraction)."""

    fractions: list
    split: str
    reduce: str
    tolerance: float


@dataclass(frozen=True)
class StudySettings:
    """study: the whole study on one model (conf/experiment/study.yaml)."""

    train: bool
    fallback_data: str
    train_overrides: dict
    split: str
    selection_split: str | None
    extra_splits: list
    n_samples: int
    alpha: float
    reestimate: bool


GROUPS = {
    "prune": PruneSettings,
    "speed": SpeedSettings,
    "export": ExportSettings,
    "importance": ImportanceSettings,
    "dynamics": DynamicsSettings,
    "study": StudySettings,
}


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
    def of(cls, cfg) -> RunSettings:
        """The settings of every group ``cfg`` holds, each read once."""
        return cls(**{name: read_settings(kind, cfg[name], name) if cfg.get(name) is not None else None for name, kind in GROUPS.items()})
