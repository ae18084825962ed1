"""Where labelled images come from: scikit-learn's digits, a Hugging Face dataset, or a folder per class."""

from pathlib import Path

import numpy as np
import torch

from headprune.core.checks import ConfigError
from headprune.tasks.vision.config import IMAGE_SUFFIXES, ImageDataConfig

DIGITS_MAX = 16  # scikit-learn's digits are 8x8 counts of 0..16 set pixels
DIGIT_CLASSES = [str(digit) for digit in range(10)]


def split_rows(count: int, config: ImageDataConfig) -> dict[str, list[int]]:
    """The rows of ``count`` images shuffled by ``data.seed``: eval, importance and train (the rest); a ConfigError when too few."""
    needed = config.eval_size + config.importance_size + 1
    if count < needed:
        raise ConfigError(
            f"{count} images cannot give data.eval_size={config.eval_size} + data.importance_size="
            f"{config.importance_size} + at least one training image: lower them"
        )
    order = torch.randperm(count, generator=torch.Generator().manual_seed(config.seed)).tolist()
    return {"eval": order[: config.eval_size], "importance": order[config.eval_size : needed - 1], "train": order[needed - 1 :]}


def split_pool(images: list, labels: list[int], config: ImageDataConfig, rows: dict | None = None) -> dict[str, tuple[list, list[int]]]:
    """One pool as (images, labels) per split of ``rows`` ({split: row indices}; None: eval, importance and train of ``split_rows``)."""
    rows = split_rows(len(images), config) if rows is None else rows
    return {split: ([images[i] for i in at], [labels[i] for i in at]) for split, at in rows.items()}


def class_folders(root: Path) -> list[Path]:
    """The class subfolders of ``data.dir``, in sorted order: class i is the i-th."""
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def class_names(config: ImageDataConfig) -> list[str] | None:
    """The class names of a source known before reading images (a folder's subfolders, the ten digits); None for a hub dataset."""
    if config.source == "folder":
        return [folder.name for folder in class_folders(Path(config.dir).expanduser())]
    return list(DIGIT_CLASSES) if config.source == "digits" else None


def digits_images(config: ImageDataConfig) -> dict[str, tuple[list, list[int]]]:
    """scikit-learn's 1,797 digits as 8x8 grayscale PIL images (0..16 scaled to 0..255), split by ``split_pool``."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    pixels = np.rint(digits.images * (255 / DIGITS_MAX)).astype(np.uint8)  # (1797, 8, 8)
    return split_pool([Image.fromarray(p, mode="L") for p in pixels], [int(t) for t in digits.target], config)


def read_folder(root: Path, load: bool = True) -> tuple[list[Path], list, list[int]]:
    """(class folders, images, labels) of ``root/<class>/<image>`` in sorted order (``load``: copies, else only verified: None);
    a ConfigError names a root without class folders, a class without images, an unreadable image."""
    from PIL import Image, UnidentifiedImageError

    classes = class_folders(root)
    if not classes:
        raise ConfigError(f"data.dir={root} holds no class subfolders: put the images of each class in data.dir/<class name>/")
    images, labels = [], []
    for label, folder in enumerate(classes):
        files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not files:
            raise ConfigError(f"{folder} (class {folder.name!r}) holds no image ({', '.join(IMAGE_SUFFIXES)}): add images or remove it")
        for path in files:
            try:
                with Image.open(path) as image:
                    images.append(image.copy() if load else image.verify())
            except (OSError, UnidentifiedImageError, SyntaxError) as err:
                raise ConfigError(f"{path} is not a readable image ({err}): remove it or replace it") from None
        labels += [label] * len(files)
    return classes, images, labels


def folder_images(config: ImageDataConfig) -> dict[str, tuple[list, list[int]]]:
    """``data.dir/<class>/<image>``: classes in sorted order, every readable image, split by ``split_pool``."""
    _, images, labels = read_folder(Path(config.dir).expanduser())
    return split_pool(images, labels, config)


def hub_rows(dataset, image_column: str, label_column: str, where: str) -> tuple[list, list[int]]:
    """The (images, labels) of a ``datasets.Dataset``; a clear error when a column is missing or a label is not a class id."""
    missing = [c for c in (image_column, label_column) if c not in dataset.column_names]
    if missing:
        raise ConfigError(
            f"{where} has no column {missing} (its columns: {dataset.column_names}): set data.image_column / data.label_column"
        )
    labels = list(dataset[label_column])
    bad = next((v for v in labels if isinstance(v, bool) or not isinstance(v, int) or v < 0), None)
    if bad is not None:
        raise ConfigError(f"{where} column {label_column!r} holds {bad!r}: labels must be class ids (integers >= 0)")
    return list(dataset[image_column]), labels


def hub_images(config: ImageDataConfig) -> dict[str, tuple[list, list[int]]]:
    """``datasets.load_dataset(hub_path, hub_name)``: its train split (importance held out of it) and its eval split."""
    from datasets import load_dataset

    parts = {}
    for split in ("train", "eval"):
        name = config.hub_splits[split]
        dataset = load_dataset(config.hub_path, config.hub_name, split=name)
        parts[split] = hub_rows(dataset, config.image_column, config.label_column, f"{config.hub_path} split {name!r}")
    held = torch.randperm(len(parts["train"][0]), generator=torch.Generator().manual_seed(config.seed)).tolist()
    cut = config.importance_size
    return {**split_pool(*parts["train"], config, {"train": held[cut:], "importance": held[:cut]}), "eval": parts["eval"]}


SOURCE_READERS = {"digits": digits_images, "folder": folder_images, "hub": hub_images}
