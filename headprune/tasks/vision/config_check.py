"""The vision task's config check: task.* and data.* settings, the image size the model takes, a local image folder."""

from __future__ import annotations

from pathlib import Path

from headprune.core.checks import ConfigError, boolean, check_schema, integer, number, optional, rule
from headprune.models.sources import config_fields

PROCESSOR_FILE = "preprocessor_config.json"

SCHEMA = {
    "task.lr": rule(number, low=0.0, closed="()"),
    "task.weight_decay": rule(number, low=0.0),
    "task.warmup_ratio": rule(number, low=0.0, high=1.0),
    "task.warmup_steps": optional(rule(integer, low=0)),
    "task.exact_eval": rule(boolean),
    "model.num_labels": rule(integer, low=2),
}


def check(cfg, files: bool = True, importance: bool = True) -> None:
    """The settings, an importance subset where importance is read, the model's image geometry, the image folder."""
    from headprune.tasks.vision.config import ImageDataConfig

    check_schema(cfg, SCHEMA)
    try:
        config = ImageDataConfig.from_cfg(cfg.data)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    if importance and config.importance_size < 1:
        raise ConfigError(
            "data.importance_size=0 leaves the importance subset empty (head importance and the held-out choices "
            "read it): set data.importance_size to a number of training images, e.g. 150"
        )
    check_geometry(cfg.model)
    if config.source == "folder" and files:
        check_folder(Path(config.dir).expanduser())


def check_geometry(model_cfg) -> None:
    """image_size must be a whole number of patches, and a model directory's image processor must make images of that size."""
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
    if processor is not None and processor.is_file():
        made = processed_size(processor)
        if made is not None and made != (size, size):
            raise ConfigError(
                f"{processor} makes {made[0]}x{made[1]} images, but the model in {processor.parent} takes {size}x{size}: "
                f"set its size to {{height: {size}, width: {size}}}, or save the processor the model was trained with"
            )


def processed_size(path: Path) -> tuple[int, int] | None:
    """(height, width) an image processor's JSON resizes to (None: it sets no fixed size); a ConfigError naming a damaged file."""
    from headprune.results.readers import read_json_file

    size = read_json_file(path).get("size")
    if isinstance(size, dict) and "height" in size and "width" in size:
        return int(size["height"]), int(size["width"])
    return None


def check_folder(root: Path) -> None:
    """``data.dir`` holds class subfolders, each with at least one image file that PIL can read (errors name the file)."""
    from PIL import Image, UnidentifiedImageError

    from headprune.tasks.vision.config import IMAGE_SUFFIXES

    if not root.is_dir():
        raise ConfigError(f"data.dir={root} does not exist: point it at a directory with one subfolder of images per class")
    classes = sorted(p for p in root.iterdir() if p.is_dir())
    if not classes:
        raise ConfigError(f"data.dir={root} holds no class subfolders: put the images of each class in data.dir/<class name>/")
    for folder in classes:
        images = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise ConfigError(f"{folder} (class {folder.name!r}) holds no image ({', '.join(IMAGE_SUFFIXES)}): add images or remove it")
        for path in images:
            try:
                with Image.open(path) as image:
                    image.verify()
            except (OSError, UnidentifiedImageError, SyntaxError) as err:
                raise ConfigError(f"{path} is not a readable image ({err}): remove it or replace it") from None
