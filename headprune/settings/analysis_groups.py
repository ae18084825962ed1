"""The groups of the paper's analyses: importance, ablate, keep_one, the study, training dynamics and inspect."""

from dataclasses import dataclass

from headprune.core.checks import boolean, choice, fractions, number, rule
from headprune.scoring.importance import REDUCTIONS
from headprune.settings.declare import COUNT, FRACTION, MAYBE_NAME, NAME, NAMES, PROBABILITY, setting


@dataclass(frozen=True)
class ImportanceSettings:
    """importance: the head-importance estimator (conf/importance/default.yaml)."""

    reduce: str = setting(rule(choice, choices=REDUCTIONS), ("prune", "speed"))
    normalize_layers: bool = setting(rule(boolean), ("prune", "speed"))
    normalize_global: bool = setting(rule(boolean), ("prune", "speed"))


@dataclass(frozen=True)
class AblateSettings:
    """ablate: every head removed alone (conf/experiment/ablate.yaml)."""

    splits: list = setting(NAMES, ("ablate",))
    groups: list = setting(NAMES, ("ablate",))
    n_samples: int = setting(COUNT, ("ablate",))
    alpha: float = setting(PROBABILITY, ("ablate",))


@dataclass(frozen=True)
class KeepOneSettings:
    """keep_one: the best head of each layer kept alone (conf/experiment/keep_one.yaml)."""

    split: str = setting(NAME, ("keep_one",))
    selection_split: str | None = setting(MAYBE_NAME, ("keep_one",))
    groups: list = setting(NAMES, ("keep_one",))
    n_samples: int = setting(COUNT, ("keep_one",))
    alpha: float = setting(PROBABILITY, ("keep_one",))


@dataclass(frozen=True)
class StudySettings:
    """study: the whole study on one model (conf/experiment/study.yaml)."""

    train: bool = setting(rule(boolean), ("study",))
    fallback_data: str = setting(NAME, ("study",))
    train_overrides: dict = setting(None, ("study",), "a mapping {dotted setting: value} for the training stage")
    split: str = setting(NAME, ("study",))
    selection_split: str | None = setting(MAYBE_NAME, ("study",))
    extra_splits: list = setting(NAMES, ("study",))
    n_samples: int = setting(COUNT, ("study",))
    alpha: float = setting(PROBABILITY, ("study",))
    reestimate: bool = setting(rule(boolean), ("study",))


@dataclass(frozen=True)
class DynamicsSettings:
    """dynamics: a training-dynamics snapshot (conf/dynamics/default.yaml; experiment=dynamics adds report_fraction)."""

    fractions: list = setting(rule(fractions), ("dynamics",))
    split: str = setting(NAME, ("dynamics",))
    reduce: str = setting(rule(choice, choices=REDUCTIONS), ("dynamics",))
    tolerance: float = setting(rule(number, low=0.0), ("dynamics",))
    report_fraction: float = setting(FRACTION, ("dynamics",))


@dataclass(frozen=True)
class InspectSettings:
    """inspect: a model's structure and cost (conf/experiment/inspect.yaml)."""

    seq_len: int = setting(COUNT, ("inspect",))
