"""Files a run reads back before any work: mask files (0/1 only)."""

from __future__ import annotations

from pathlib import Path

from headprune.core.checks import ConfigError


def read_json_file(path) -> dict:
    """A JSON file, or a ConfigError naming it."""
    from headprune.results.writer import read_json

    try:
        return read_json(path)
    except (OSError, ValueError) as err:
        raise ConfigError(str(err)) from None


def check_mask_file(path, setting: str = "speed.mask_file") -> None:
    """A mask file (``setting``) exists, is JSON, and every mask in it holds only 0 (pruned) and 1 (kept)."""
    path = Path(str(path))
    if not path.is_file():
        raise ConfigError(f"{setting}={path} does not exist ({path.resolve()})")
    payload = read_json_file(path)
    if "mask" in payload:
        check_binary_mask(payload["mask"], f"{path}")
        return
    orders = (payload.get("results") or {}).get("orders") or ((payload.get("results") or {}).get("prune") or {}).get("orders") or {}
    for order, result in orders.items():
        for step in result.get("steps", []):
            check_binary_mask(step.get("mask") or {}, f"{path} (order {order}, fraction {step.get('fraction')})")
    results = payload.get("results") or {}
    for point in results.get("points") or (results.get("pareto") or {}).get("points") or []:
        if "mask" in point:  # the unpruned point has none
            check_binary_mask(point["mask"], f"{path} (Pareto point {point.get('order')}+{point.get('recovery')} {point.get('step')})")


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
