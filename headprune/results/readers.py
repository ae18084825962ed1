"""Files a run reads back before any work: JSON inputs, and the 0/1 check of a mask (mask files: ``mask_files``)."""

from headprune.core.checks import ConfigError
from headprune.results.writer import read_json


def read_json_file(path) -> dict:
    """A JSON file, or a ConfigError naming it."""
    try:
        return read_json(path)
    except (OSError, ValueError) as err:
        raise ConfigError(str(err)) from None


def check_binary_mask(raw: dict, where: str) -> None:
    """Every value of a JSON mask {group: [[...]]} is 0 or 1; else a ConfigError naming group, layer and head."""
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"{where}: a mask is {{group: [[0/1 per head] per layer]}}, got {type(raw).__name__}")
    for group, layers in raw.items():
        if not isinstance(layers, list) or not all(isinstance(row, list) for row in layers):
            raise ConfigError(f"{where}: mask of group {group!r} must be a list of layers, each a list of 0/1 per head")
        for layer, row in enumerate(layers):
            for head, value in enumerate(row):
                if isinstance(value, bool) or value not in (0, 1):
                    raise ConfigError(
                        f"{where}: group {group} layer {layer} head {head} has {value!r} (0-based ids); a mask holds 0 (pruned) or 1 (kept)"
                    )
