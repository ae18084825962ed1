"""The NLI data settings (``cfg.data``), checked without reading any data (no torch or Lightning import)."""
from __future__ import annotations

from dataclasses import dataclass, field

from headprune.data.nli_files import NLIDataError

SOURCES = ("local", "hub", "synthetic")
SPLITS = ("train", "eval", "eval_mismatched")  # as read from the source; "importance" is carved out of train
REQUIRED = ("train", "eval")


@dataclass
class NLIDataConfig:
    """Everything the datamodule reads from ``cfg.data``."""

    source: str = "synthetic"
    dir: str | None = None  # local: the directory with one file per split
    files: dict = field(default_factory=lambda: {"train": "train", "eval": "dev_matched", "eval_mismatched": "dev_mismatched"})
    hub_path: str = "nyu-mll/glue"
    hub_name: str = "mnli"
    hub_splits: dict = field(default_factory=lambda: {"train": "train", "eval": "validation_matched", "eval_mismatched": "validation_mismatched"})
    synthetic: dict = field(default_factory=lambda: {"seed": 0, "train_size": 3000, "eval_size": 600, "mismatched_size": 600})
    max_length: int = 128
    batch_size: int = 32
    eval_batch_size: int = 128
    limit_train: int | None = None  # examples of train kept after the importance subset is set aside
    limit_eval: int | None = None  # examples of each evaluation split (the first ones in file order)
    importance_size: int = 2000
    importance_holdout: bool = True  # remove the importance subset from the training examples
    importance_batch_size: int = 32
    group_by_length: bool = True
    megabatch: int = 50  # length grouping sorts within windows of megabatch * batch_size examples
    seed: int = 0
    num_workers: int = 0
    name: str | None = None

    @classmethod
    def from_cfg(cls, cfg) -> "NLIDataConfig":
        """Build from a Hydra/dict config, rejecting unknown keys and bad values with clear messages."""
        from omegaconf import DictConfig, OmegaConf

        values = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise NLIDataError(f"unknown data setting(s) {unknown}; the NLI data settings are {sorted(known)}")
        out = cls(**values)
        out.check()
        return out

    def check(self) -> None:
        if self.source not in SOURCES:
            raise NLIDataError(f"data.source={self.source!r} is not one of {list(SOURCES)}")
        if self.source == "local" and not self.dir:
            raise NLIDataError("data.source=local needs data.dir (a directory with train.jsonl[.gz] / dev_matched.jsonl or GLUE TSVs)")
        for key in ("batch_size", "eval_batch_size", "importance_batch_size", "max_length", "megabatch"):
            value = getattr(self, key)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise NLIDataError(f"data.{key} must be a positive integer, got {value!r}")
        for key in ("limit_train", "limit_eval"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise NLIDataError(f"data.{key} must be a positive integer or null (no limit), got {value!r}")
        if not isinstance(self.importance_size, int) or self.importance_size < 0:
            raise NLIDataError(f"data.importance_size must be an integer >= 0, got {self.importance_size!r}")
