"""Translation data settings without reading data: split names and per-split limits (no torch or Lightning import)."""

SPLITS = ("train", "valid", "test")


def split_limit(data_cfg, split: str) -> int | None:
    """``data.limits.<split>``: a positive number of pairs to keep, or None (all)."""
    value = (data_cfg.get("limits") or {}).get(split)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"data.limits.{split} must be a positive integer (pairs kept) or null (all), got {value!r}")
    return value


def split_of(data_cfg, split: str) -> str:
    """Map the protocol's ``eval``/``heldout`` to a concrete split name."""
    if split in ("eval", "heldout"):
        return data_cfg[f"{split}_split"]  # data.eval_split, data.heldout_split
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}: use train, valid, test, eval or heldout")
    return split
