"""The vision task's config check: settings, image geometry, a local image folder, a saved model's classes, a hub dataset."""

from pathlib import Path

from headprune.core.checks import ConfigError, integer, rule
from headprune.models.sources import config_fields
from headprune.tasks.config_check import TRAINER_SCHEMA, checked_data
from headprune.tasks.data_sources import check_hub_dataset

PROCESSOR_FILE = "preprocessor_config.json"

SCHEMA = {**TRAINER_SCHEMA, "model.num_labels": rule(integer, low=2)}


def check(cfg, files: bool = True, importance: bool = True) -> None:
    """The settings, an importance subset, the image geometry, the image folder, a saved model's classes, the hub dataset."""
    from headprune.tasks.vision.config import ImageDataConfig

    config = checked_data(cfg, SCHEMA, ImageDataConfig, importance, "images, e.g. 150")
    check_geometry(cfg.model)
    if config.source == "folder" and files:
        check_folder(Path(config.dir).expanduser(), config)
    check_saved_classes(cfg, config)
    if config.source == "hub" and files:
        check_hub_dataset(
            cfg.data, config.hub_path, "data.hub_path", "data=image_digits or data.source=folder data.dir=<dir of class folders>"
        )


def check_geometry(model_cfg) -> None:
    """image_size must be a whole number of patches, and a model directory's image processor must make images of that size."""
    from headprune.results.readers import read_json_file

    fields = config_fields(model_cfg) or {}
    size, patch = fields.get("image_size"), fields.get("patch_size")
    if size is None or patch is None:
        return  # a hub model: its processor sizes the images for it
    if not isinstance(size, int) or not isinstance(patch, int) or size < 1 or patch < 1 or size % patch:
        raise ConfigError(
            f"model {model_cfg.get('name')}: image_size={size} is not a whole number of patch_size={patch} patches: "
            f"set model.config.image_size to a multiple of {patch}"
        )
    pretrained = model_cfg.get("pretrained")
    processor = Path(str(pretrained)).expanduser() / PROCESSOR_FILE if pretrained else None
    resized = read_json_file(processor).get("size") if processor is not None and processor.is_file() else None  # None: no fixed size
    if isinstance(resized, dict) and "height" in resized and "width" in resized:
        made = int(resized["height"]), int(resized["width"])
        if made != (size, size):
            raise ConfigError(
                f"{processor} makes {made[0]}x{made[1]} images, but the model in {processor.parent} takes {size}x{size}: "
                f"set its size to {{height: {size}, width: {size}}}, or save the processor the model was trained with"
            )


def check_folder(root: Path, config) -> None:
    """``data.dir`` holds two readable class subfolders or more, each with enough images to give every split some."""
    from headprune.tasks.vision.image_sources import read_folder

    if not root.is_dir():
        raise ConfigError(f"data.dir={root} does not exist: point it at a directory with one subfolder of images per class")
    classes, _, labels = read_folder(root, load=False)  # every image verified, none decoded
    if len(classes) < 2:
        raise ConfigError(
            f"data.dir={root} holds one class subfolder ({classes[0].name!r}): a classifier needs two classes or more "
            "(every image would be right); put the images of each class in data.dir/<class name>/"
        )
    check_classes_split(root, [folder.name for folder in classes], labels, config)


def check_classes_split(root: Path, names: list[str], labels: list[int], config) -> None:
    """Every class has images in train and in eval after the split; else a ConfigError naming the class and its image count."""
    from headprune.tasks.vision.image_sources import split_rows

    rows = split_rows(len(labels), config)
    for split, limit in (("train", config.limit_train), ("eval", config.limit_eval)):
        present = {labels[i] for i in rows[split][:limit]}
        for label, name in enumerate(names):
            if label in present:
                continue
            count = labels.count(label)
            kept = f", of which data.limit_{split}={limit} are kept" if limit else ""
            raise ConfigError(
                f"class {name!r} (data.dir={root}) has {count} image{'s' * (count != 1)}, too few for the splits: none is "
                f"in {split} (data.seed={config.seed} shuffles the {len(labels)} images into data.eval_size={config.eval_size} "
                f"for eval, data.importance_size={config.importance_size} held out and the rest for train{kept}): add images "
                f"of class {name!r}, or change data.eval_size / data.seed"
            )


def check_saved_classes(cfg, config) -> None:
    """A model directory saved by headprune keeps its head: its classes must be the data's (the names, where both name them)."""
    from headprune.core.saving import RECORD_FILE
    from headprune.models.sources import resolve_pretrained
    from headprune.results.readers import read_json_file
    from headprune.tasks.vision.image_sources import class_names

    pretrained = cfg.model.get("pretrained")
    if not pretrained or str(pretrained).endswith(".ckpt"):
        return
    path = Path(resolve_pretrained(str(pretrained)))
    if not (path / RECORD_FILE).is_file() or not (path / "config.json").is_file():
        return  # a hub model: its head is replaced by one of the data's classes
    saved = read_json_file(path / "config.json").get("id2label") or {}
    saved = [str(saved[key]) for key in sorted(saved, key=int)]
    names = class_names(config)
    wanted = len(names) if names else int(cfg.model.num_labels)
    generic = saved == [f"LABEL_{i}" for i in range(len(saved))]  # a model saved without class names
    if saved and (len(saved) != wanted or (names and not generic and saved != names)):
        has = f"{len(names)} classes {names}" if names else f"model.num_labels={wanted} classes"
        raise ConfigError(
            f"model.pretrained={pretrained} classifies {len(saved)} classes {saved}, but data={cfg.data.get('name')} "
            f"(data.source={config.source}) has {has}: use it on the data it was trained on, or fine-tune a model on "
            "this data (experiment=vit_finetune)"
        )
