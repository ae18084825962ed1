"""Typed checks of single settings: each returns the value or raises a ConfigError naming the setting."""

import inspect
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace

from omegaconf import OmegaConf


class ConfigError(ValueError):
    """A setting, data file or model directory that cannot be used, named with how to fix it."""


class DataError(ValueError):
    """A data file or data setting that cannot be used: one message naming the file and line, or the setting."""


class ConfigWarning(UserWarning):
    """A setting that is allowed but will not do what it seems to (e.g. a key no experiment reads)."""


def warn(message: str) -> None:
    """Warn about a setting (a ConfigWarning, shown once per message)."""
    warnings.warn(message, ConfigWarning, stacklevel=3)


def integer(value, name: str, low: int | None = None, high: int | None = None) -> int:
    """``value`` as an int (>= ``low``, <= ``high``), or a ConfigError naming the setting."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{name} must be an integer, got {value!r}")
    if low is not None and value < low:
        raise ConfigError(f"{name} must be >= {low}, got {value}")
    if high is not None and value > high:
        raise ConfigError(f"{name} must be <= {high}, got {value}")
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


def boolean(value, name: str) -> bool:
    """``value`` as a bool (true or false, never a word such as ``maybe`` or a number), or a ConfigError."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name} must be true or false, got {value!r}")
    return value


def choice(value, name: str, choices) -> str:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {list(choices)}, got {value!r}")
    return str(value)


def text(value, name: str) -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{name} must be a non-empty text, got {value!r}")
    return value


def string_list(value, name: str, empty: bool = True) -> list[str]:
    """A list of strings (a single string counts as a one-item list); ``empty=False`` refuses []."""
    if isinstance(value, str):
        return [value]
    if not OmegaConf.is_list(value) and not isinstance(value, (list, tuple)):
        raise ConfigError(f"{name} must be a list of names, got {value!r}")
    items = list(value)
    if not all(isinstance(v, str) for v in items):
        raise ConfigError(f"{name} must be a list of names, got {items!r}")
    if not items and not empty:
        raise ConfigError(f"{name} is empty: give at least one name")
    return items


def no_duplicates(values, name: str, fix: str = "list each item once") -> None:
    """A list setting names each item once (a repeat would compute and write the same thing twice)."""
    items = [OmegaConf.to_container(v) if OmegaConf.is_config(v) else v for v in values]
    repeated = [v for i, v in enumerate(items) if v in items[:i]]
    if repeated:
        raise ConfigError(f"{name}={items} names {repeated[0]!r} more than once: {fix}")


def choices(value, name: str, known) -> list[str]:
    """A name or a non-empty list of names, each one of ``known``."""
    items = string_list(value, name, empty=False)
    for item in items:
        choice(item, name, known)
    return items


def recovery_chains(value, name: str, known) -> list[str]:
    """Recoveries, each a name of ``known`` or a chain of them run in turn (``reconstruct+finetune``), in ``known``'s order."""
    items = string_list(value, name, empty=False)
    for item in items:
        steps = item.split("+")
        for step in steps:
            choice(step, name, known)
        if len(steps) > 1 and "none" in steps:
            raise ConfigError(f"{name}: {item!r} chains none, which recovers nothing: give none alone")
        if len(set(steps)) < len(steps):
            raise ConfigError(f"{name}: {item!r} runs a step twice: give each step once")
        order = [known.index(step) for step in steps]
        if order != sorted(order):
            ordered = "+".join(sorted(steps, key=known.index))
            raise ConfigError(f"{name}: {item!r} runs its steps out of order: write {ordered!r} (compensation before a fine-tune)")
    return items


def pruning_unit(value, name: str):
    """A registered unit kind or a list of kinds pruned together, as its ``Unit`` (canonical name ``head+ffn``)."""
    from headprune.core.kinds.kind_registry import KINDS, parse_unit

    kinds = tuple(KINDS)
    joint = OmegaConf.is_list(value) or isinstance(value, (list, tuple))
    if not joint and not isinstance(value, str):
        raise ConfigError(f"{name} must be one of {list(kinds)} or a list of them such as [head, ffn], got {value!r}")
    try:
        return parse_unit(list(value) if joint else value)
    except ValueError as err:
        raise ConfigError(f"{name}: {err}") from None


def fractions(value, name: str) -> list[float]:
    """A fraction or a list of them, each in [0, 1)."""
    items = list(value) if OmegaConf.is_list(value) or isinstance(value, (list, tuple)) else [value]
    if not items:
        raise ConfigError(f"{name} is empty: give fractions in [0, 1), e.g. [0, 0.5]")
    return [number(v, name, 0.0, 1.0) for v in items]


def positive_ints(value, name: str) -> list[int]:
    """A non-empty list of positive integers."""
    if not (OmegaConf.is_list(value) or isinstance(value, (list, tuple))) or not list(value):
        raise ConfigError(f"{name} must be a non-empty list of positive integers, got {value!r}")
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in value):
        raise ConfigError(f"{name} must be positive integers, got {list(value)}")
    return list(value)


def boolean_or(value, name: str, words: tuple[str, ...]):
    """true, false or one of ``words`` (e.g. ``both``), or a ConfigError."""
    if isinstance(value, bool) or (isinstance(value, str) and value in words):
        return value
    raise ConfigError(f"{name} must be false, true or {' or '.join(words)}, got {value!r}")


@dataclass(frozen=True)
class Rule:
    """A schema rule: ``rule(value, name)`` is ``check(value, name, *args, **kwargs)`` (null passes when ``nullable``)."""

    check: Callable
    args: tuple = ()
    kwargs: tuple = ()  # (keyword, value) pairs
    nullable: bool = False

    def __call__(self, value, name: str):
        return None if self.nullable and value is None else self.check(value, name, *self.args, **dict(self.kwargs))

    def __str__(self) -> str:
        """What the rule accepts, in words (``number in (0.0, 1.0)``, ``one of head, kv_group``, ``... or null``)."""
        bound = inspect.signature(self.check).bind(None, "", *self.args, **dict(self.kwargs))
        bound.apply_defaults()
        said = DESCRIPTIONS[self.check.__name__](**{k: v for k, v in bound.arguments.items() if k not in ("value", "name")})
        return f"{said} or null" if self.nullable else said


def rule(check: Callable, *args, **kwargs) -> Rule:
    """A schema rule: ``check(value, name, *args, **kwargs)``."""
    return Rule(check, args, tuple(kwargs.items()))


def optional(inner: Rule) -> Rule:
    """``inner``, or null."""
    return replace(inner, nullable=True)


def _bounds(low, high, closed: str = "[]") -> str:
    if low is not None and high is not None:
        return f" in {closed[0]}{low}, {high}{closed[1]}"
    if low is not None:
        return f" {'>=' if closed[0] == '[' else '>'} {low}"
    return f" {'<=' if closed[1] == ']' else '<'} {high}" if high is not None else ""


def _names(items) -> str:
    return ", ".join(str(i) for i in items)


DESCRIPTIONS = {  # check function -> what it accepts, from its arguments
    "integer": lambda low, high: "integer" + _bounds(low, high),
    "number": lambda low, high, closed: "number" + _bounds(low, high, closed),
    "boolean": lambda: "true or false",
    "choice": lambda choices: f"one of {_names(choices)}",
    "choices": lambda known: f"one or a list of {_names(known)}",
    "recovery_chains": lambda known: f"one or a list of {_names(known)}, each alone or chained with + (reconstruct+finetune)",
    "text": lambda: "text",
    "string_list": lambda empty: "list of names" + ("" if empty else " (not empty)"),
    "pruning_unit": lambda: (
        "a registered kind (head, kv_group, ffn, block, layer, ...), or a list of kinds of different parts ([head, ffn])"
    ),
    "fractions": lambda: "fraction or list of fractions in [0, 1)",
    "positive_ints": lambda: "list of positive integers",
    "boolean_or": lambda words: f"true, false or {' or '.join(words)}",
}


def setting(cfg, dotted: str, missing=None):
    """The value of a dotted setting, or ``missing`` when the config lacks it or a section on the way."""
    node = cfg
    for part in dotted.split("."):
        if node is None or not hasattr(node, "get") or part not in node:
            return missing
        node = node[part]
    return node


ABSENT = object()


def check_schema(cfg, schema: dict[str, Rule]) -> None:
    """Apply every rule of ``schema`` to the setting the config holds (settings it lacks are not checked)."""
    for dotted, check in schema.items():
        value = setting(cfg, dotted, ABSENT)
        if value is not ABSENT:
            check(value, dotted)
