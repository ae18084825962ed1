"""The image data settings (``data.*`` of conf/data/image_*.yaml), read once into a checked dataclass."""

from dataclasses import dataclass, field

from headprune.core.checks import integer

SOURCES = ("digits", "hub", "folder")
SPLITS = ("train", "importance", "eval")  # importance is held out of the training images, never evaluation data
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp")


@dataclass(frozen=True)
class ImageDataConfig:
    """Where the images come from, how they are split and batched."""

    source: str
    seed: int
    eval_size: int
    importance_size: int
    batch_size: int
    eval_batch_size: int
    limit_train: int | None = None
    limit_eval: int | None = None
    dir: str | None = None
    hub_path: str | None = None
    hub_name: str | None = None
    hub_splits: dict = field(default_factory=dict)
    image_column: str = "image"
    label_column: str = "label"

    @classmethod
    def from_cfg(cls, data) -> "ImageDataConfig":
        """Read ``data.*``; a ValueError names the setting that is wrong and what it takes."""
        source = data.get("source")
        if source not in SOURCES:
            raise ValueError(f"data.source={source!r} is not an image source: use one of {list(SOURCES)}")
        lows = {"seed": 0, "eval_size": 1, "importance_size": 0, "batch_size": 1, "eval_batch_size": 1}
        numbers = {key: integer(data.get(key), f"data.{key}", low) for key, low in lows.items()}
        limits = {key: None if data.get(key) is None else integer(data.get(key), f"data.{key}", 1) for key in ("limit_train", "limit_eval")}
        config = cls(
            source=source,
            **numbers,
            **limits,
            dir=None if data.get("dir") is None else str(data.get("dir")),
            **{key: data.get(key) for key in ("hub_path", "hub_name")},
            **{key: str(data.get(key)) for key in ("image_column", "label_column")},
            hub_splits=dict(data.get("hub_splits") or {}),
        )
        if source == "folder" and not config.dir:
            raise ValueError("data.source=folder needs data.dir=<a directory with one subfolder of images per class>")
        if source == "hub":
            if not config.hub_path:
                raise ValueError("data.source=hub needs data.hub_path=<a Hugging Face dataset name>, e.g. ylecun/mnist")
            unknown = sorted(set(config.hub_splits) - {"train", "eval"})
            if unknown or "train" not in config.hub_splits or "eval" not in config.hub_splits:
                raise ValueError(
                    f"data.hub_splits={config.hub_splits} must name the dataset's split for train and for eval "
                    f"(unknown keys: {unknown}), e.g. {{train: train, eval: test}}"
                )
        return config
