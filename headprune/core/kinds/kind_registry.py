"""The registry of pruning-unit kinds, and units that join several kinds under one budget (``parse_unit``: a ``Unit``)."""

from collections.abc import Iterable
from dataclasses import dataclass

from headprune.core.kinds.gates_protocol import missing_members
from headprune.core.kinds.unit_kind import UnitKind

JOINER = "+"  # "head+ffn": the kinds of a joint unit in one string
KINDS: dict[str, UnitKind] = {}
# each kind defines these methods or sets the attribute UnitKind's own reads (UnitKind's, without it, raise NotImplementedError)
REQUIRED_METHODS = {"owns": "groups", "gates": "gates_class", "flops_tables": None, "prune": None}


@dataclass(frozen=True)
class Unit:
    """A unit's kinds in the registry's order, parsed once (``parse_unit``); every function here takes it as it takes a name."""

    kinds: tuple[UnitKind, ...]

    @property
    def name(self) -> str:
        """Its canonical name: ``head+ffn`` for [ffn, head]."""
        return JOINER.join(kind.name for kind in self.kinds)

    @property
    def is_joint(self) -> bool:
        return len(self.kinds) > 1

    def __str__(self) -> str:
        return self.name


def register_kind(kind: UnitKind, replace: bool = False) -> UnitKind:
    """Add a kind to the registry (``replace``: over one of the same name); returns it."""
    if isinstance(kind, type) and issubclass(kind, UnitKind):
        raise TypeError(f"register_kind takes an instance of the kind: register_kind({kind.__name__}()), not the class")
    if not isinstance(kind, UnitKind):
        raise TypeError(f"register_kind takes a UnitKind instance, got {type(kind).__name__} {kind!r:.60}")
    name = kind.name
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(
            f"{type(kind).__name__}.name must be a non-empty identifier-like string (letters, digits, _; the value of "
            f"prune.unit), got {name!r}"
        )
    if not kind.parts:
        raise ValueError(f"{type(kind).__name__} ({name!r}) names no parts: set parts, e.g. ('feed_forward',)")
    missing = [
        method
        for method, attribute in REQUIRED_METHODS.items()
        if getattr(type(kind), method) is getattr(UnitKind, method) and not (attribute and getattr(kind, attribute))
    ]
    if missing:
        raise TypeError(
            f"{type(kind).__name__} ({name!r}) does not implement {', '.join(missing)}: every kind defines {', '.join(REQUIRED_METHODS)}"
        )
    lacking = missing_members(kind.gates_class) if isinstance(kind.gates_class, type) else []
    if lacking:
        raise TypeError(
            f"{kind.gates_class.__name__}, the gates of {type(kind).__name__} ({name!r}), lacks {', '.join(lacking)}: "
            "every kind's gates provide the methods of headprune.core.kinds.gates_protocol.Gates"
        )
    if kind.name in KINDS and not replace:
        raise ValueError(f"a pruning-unit kind named {kind.name!r} is registered already ({KINDS[kind.name]!r}); pass replace=True")
    KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Remove a kind from the registry (a test's own kind, say)."""
    KINDS.pop(name, None)


def kind_named(name: str) -> UnitKind:
    """The registered kind of this name, or a ValueError listing them."""
    if name not in KINDS:
        raise ValueError(f"unknown pruning-unit kind {name!r}: registered kinds are {list(KINDS)}")
    return KINDS[name]


def unit_kinds(unit) -> tuple[str, ...]:
    """A unit's kinds in registry order (``"head+ffn"``, ``["ffn", "head"]`` -> (head, ffn)); a ValueError: unknown, twice, same part."""
    if isinstance(unit, Unit):
        return tuple(kind.name for kind in unit.kinds)
    if not isinstance(unit, str) and not (isinstance(unit, Iterable) and all(isinstance(k, str) for k in unit)):
        raise ValueError(
            f"a unit is a kind's name or a list of names, e.g. 'head' or ['kv_group', 'ffn']; got {type(unit).__name__} {unit!r:.40}"
        )
    names = [n.strip() for n in (unit.split(JOINER) if isinstance(unit, str) else unit)]
    unknown = [n for n in names if n not in KINDS]
    if unknown or not names:
        raise ValueError(
            f"unknown pruning unit {unit!r}: give one of {list(KINDS)} or a joint list of kinds that prune different "
            f"parts, e.g. [head, ffn] or [kv_group, ffn] (written head+ffn)"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"pruning unit {unit!r} names a kind twice")
    taken: dict[str, str] = {}
    for name in names:
        for part in KINDS[name].parts:
            if part in taken:
                raise ValueError(
                    f"pruning unit {unit!r} joins {taken[part]} and {name}, which both prune the {part} part: a joint unit "
                    "joins kinds of different parts ([head, ffn] or [kv_group, ffn]; block prunes whole attention and FFN blocks alone)"
                )
            taken[part] = name
    return tuple(k for k in KINDS if k in names)


def kinds_of(unit) -> tuple[UnitKind, ...]:
    """The kind objects of a unit (see ``unit_kinds``)."""
    return unit.kinds if isinstance(unit, Unit) else tuple(KINDS[k] for k in unit_kinds(unit))


def parse_unit(unit) -> Unit:
    """A unit (a name, a list of names or a ``Unit``) as its value, parsed once (a ValueError as ``unit_kinds``)."""
    return unit if isinstance(unit, Unit) else Unit(kinds_of(unit))


def unit_name(unit) -> str:
    """The unit's canonical name: ``"head+ffn"`` for [ffn, head]."""
    return JOINER.join(unit_kinds(unit))


def is_joint(unit) -> bool:
    """Whether a unit joins several kinds."""
    return len(unit_kinds(unit)) > 1


def shrunk_fields(unit) -> set[str]:
    """The config fields a unit's kinds shrink (empty for anything that is no unit)."""
    try:
        return {field for kind in kinds_of(unit) for field in kind.config_fields}
    except (ValueError, TypeError, AttributeError):
        return set()


def recovery_parts(unit) -> set[str]:
    """The parts least-squares recovery refits after a unit's kinds remove units (``attention``, ``feed_forward`` ...)."""
    return {part for kind in kinds_of(unit) for part in kind.recovery_parts}


def lsq_refits_heads_alone(unit) -> bool:
    """Whether least-squares recovery after ``unit`` refits query heads alone: their scales, fitted under the mask before any weight goes."""
    return not recovery_parts(unit) - {"attention"}


def latency_timings(unit) -> tuple[bool, bool]:
    """(whether ``unit``'s latency tables read timings of the attention, whether of the feed-forward blocks)."""
    parts = {part for kind in kinds_of(unit) for part in kind.latency_parts() or ()}
    return "attention" in parts, "feed_forward" in parts


def group_kind(group: str, unit=None) -> str | None:
    """The kind whose units a mask group holds: the first kind of ``unit`` that owns it, else the registry's first; None if none."""
    kinds = (*kinds_of(unit), *KINDS.values()) if unit is not None else tuple(KINDS.values())
    return next((kind.name for kind in kinds if kind.owns(str(group))), None)


def kind_of_group(group, unit=None) -> UnitKind:
    """The kind whose units a mask group holds (as ``group_kind``); a group no registered kind owns is a ValueError naming it."""
    name = group_kind(str(group), unit)
    if name is None:
        raise ValueError(
            f"mask group {group!r} is of no registered unit kind ({', '.join(KINDS)}): check the mask's groups, or register "
            "the kind that owns it (register_kind) before reading it"
        )
    return KINDS[name]


def mask_kinds(groups, unit=None) -> tuple[str, ...]:
    """The kinds a mask's groups hold (registry order); a group of no kind is a ValueError naming it."""
    kinds = {kind_of_group(group, unit).name for group in groups}
    return tuple(k for k in KINDS if k in kinds)


def reconstruction_refusal(unit) -> str | None:
    """Why reconstruction cannot follow ``unit``: ``kind: reason`` of the first refusing kind (else the first, if none re-solves); None."""
    kinds = kinds_of(unit)
    refused = next((f"{kind.name}: {kind.reconstruction}" for kind in kinds if kind.reconstruction), None)
    if refused or not all(kind.reconstruction_alone for kind in kinds):
        return refused
    return f"{kinds[0].name}: {kinds[0].reconstruction_alone}"


def ablation_refusal(unit) -> str | None:
    """Why single-unit ablation is no useful order for ``unit`` (a kind of it refuses), else None."""
    return next((kind.ablation for kind in kinds_of(unit) if kind.ablation), None)


def keep_one_refusal(unit) -> str | None:
    """Why keeping each layer's best unit measures nothing for ``unit`` (a kind of it refuses), else None."""
    return next((kind.keep_one for kind in kinds_of(unit) if kind.keep_one), None)


def lsq_refusal(unit) -> str | None:
    """Why least-squares recovery cannot follow ``unit`` (a kind conflicts with it, or every kind fits nothing), else None."""
    reasons = [kind.recovery_refusal() for kind in kinds_of(unit)]
    conflict = next((f"{kind.name}: {kind.lsq_conflict}" for kind in kinds_of(unit) if kind.lsq_conflict), None)
    return conflict or (reasons[0] if all(reasons) else None)


def noun(unit, plural: bool = False) -> str:
    """What one unit is called (``head``, ``neuron``; ``unit`` for a joint unit), optionally plural."""
    kinds = kinds_of(unit)
    word = kinds[0].noun if len(kinds) == 1 else "unit"
    return word + "s" if plural else word
