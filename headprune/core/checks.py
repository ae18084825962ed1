"""Typed checks of single settings: each returns the value or raises a ConfigError naming the setting."""

from __future__ import annotations

import math

from omegaconf import OmegaConf


class ConfigError(ValueError):
    """A setting, data file or model directory that cannot be used, named with how to fix it."""


def integer(value, name: str, low: int | None = None) -> int:
    """``value`` as an int (>= ``low``), or a ConfigError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")
    return value


def number(value, name: str, low: float | None = None, high: float | None = None, closed: str = "[)") -> float:
    """``value`` as a finite float within [low, high) (``closed`` picks the brackets), or a ConfigError."""
    try:
        if isinstance(value, bool):
            raise TypeError
        out = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if math.isnan(out) or math.isinf(out):
        raise ConfigError(f"{name} must be a finite number, got {value!r}")
    below = low is not None and (out < low if closed[0] == "[" else out <= low)
    above = high is not None and (out > high if closed[1] == "]" else out >= high)
    if below or above:
        raise ConfigError(f"{name} must be in {closed[0]}{low}, {high}{closed[1]}, got {value!r}")
    return out


def choice(value, name: str, choices) -> str:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
    return str(value)


def string_list(value, name: str) -> list[str]:
    """A list of strings (a single string counts as a one-item list)."""
    if isinstance(value, str):
        return [value]
    if not OmegaConf.is_list(value) and not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name} must be a list of names, got {value!r}")
    items = list(value)
    if not all(isinstance(v, str) for v in items):
        raise ConfigError(f"{name} must be a list of names, got {items!r}")
    return items


def fractions(value, name: str) -> list[float]:
    """A fraction or a list of them, each in [0, 1)."""
    items = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigError(f"{name} is empty: give fractions in [0, 1), e.g. [0, 0.5]")
    return [number(v, name, 0.0, 1.0) for v in items]
