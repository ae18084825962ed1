"""The NLI data settings (``cfg.data``), checked without reading any data (no torch or Lightning import)."""

from dataclasses import MISSING, dataclass

from headprune.tasks.nli.files import NLIDataError

SOURCES = ("local", "hub", "synthetic")
SPLITS = ("train", "eval", "eval_mismatched")  # as read from the source; "importance" is carved out of train
REQUIRED = ("train", "eval")


@dataclass
class NLIDataConfig:
    """Everything the datamodule reads from ``cfg.data`` (values in conf/data/nli_*.yaml, none repeated here)."""

    name: str | None
    source: str  # local | hub | synthetic
    dir: str | None  # local: the directory with one file per split
    files: dict  # split -> file stem (local)
    max_length: int
    batch_size: int
    eval_batch_size: int
    limit_train: int | None  # examples of train kept after the importance subset is set aside
    limit_eval: int | None  # examples of each evaluation split (the first ones in file order)
    importance_size: int
    importance_holdout: bool  # remove the importance subset from the training examples
    importance_batch_size: int
    group_by_length: bool
    megabatch: int  # length grouping sorts within windows of megabatch * batch_size examples
    seed: int
    num_workers: int
    hub_path: str | None = None  # hub only (conf/data/nli_hub.yaml)
    hub_name: str | None = None
    hub_splits: dict | None = None
    synthetic: dict | None = None  # synthetic only (conf/data/nli_synthetic.yaml): seed and split sizes

    @classmethod
    def from_cfg(cls, cfg) -> "NLIDataConfig":
        """Build from a Hydra/dict config, rejecting unknown keys and bad values with clear messages."""
        from omegaconf import DictConfig, OmegaConf

        values = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(values) - known)
        if unknown:
            raise NLIDataError(f"unknown data setting(s) {unknown}; the NLI data settings are {sorted(known)}")
        missing = sorted(k for k, f in cls.__dataclass_fields__.items() if k not in values and f.default is MISSING)
        if missing:
            raise NLIDataError(f"data setting(s) {missing} missing: start the data config from conf/data/nli_local.yaml")
        return cls(**values)

    def __post_init__(self) -> None:
        """Refuse a bad value with a message naming its setting (``from_cfg`` refused unknown and missing ones)."""
        if self.source not in SOURCES:
            raise NLIDataError(f"data.source={self.source!r} is not one of {list(SOURCES)}")
        needs = {"hub": ("hub_path", "hub_name", "hub_splits"), "synthetic": ("synthetic",)}.get(self.source, ())
        if any(getattr(self, key) is None for key in needs):
            raise NLIDataError(f"data.source={self.source} needs data.{', data.'.join(needs)} (conf/data/nli_{self.source}.yaml)")
        if self.source == "local" and not self.dir:
            raise NLIDataError("data.source=local needs data.dir (a directory with train.jsonl[.gz] / dev_matched.jsonl or GLUE TSVs)")
        for key in ("batch_size", "eval_batch_size", "importance_batch_size", "max_length", "megabatch", "limit_train", "limit_eval"):
            value, limit = getattr(self, key), key.startswith("limit_")  # a limit may be null
            if not (limit and value is None) and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
                raise NLIDataError(f"data.{key} must be a positive integer{' or null (no limit)' if limit else ''}, got {value!r}")
        for key in ("importance_holdout", "group_by_length"):
            if not isinstance(getattr(self, key), bool):
                raise NLIDataError(f"data.{key} must be true or false, got {getattr(self, key)!r}")
        if not isinstance(self.importance_size, int) or isinstance(self.importance_size, bool) or self.importance_size < 0:
            raise NLIDataError(f"data.importance_size must be an integer >= 0, got {self.importance_size!r}")
