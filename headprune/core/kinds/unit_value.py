"""A pruning unit parsed once: its kinds in the registry's order, its canonical name and whether it joins several."""

from __future__ import annotations

from dataclasses import dataclass

from headprune.core.kinds.unit_kind import UnitKind

JOINER = "+"  # "head+ffn": the kinds of a joint unit in one string


@dataclass(frozen=True)
class Unit:
    """A unit's kinds, parsed once (``parse_unit``); every kind function takes it as it takes a unit's name."""

    kinds: tuple[UnitKind, ...]

    @property
    def names(self) -> tuple[str, ...]:
        """Its kinds' names, in the registry's order."""
        return tuple(kind.name for kind in self.kinds)

    @property
    def name(self) -> str:
        """Its canonical name: ``head+ffn`` for [ffn, head]."""
        return JOINER.join(self.names)

    @property
    def is_joint(self) -> bool:
        """Whether it joins several kinds."""
        return len(self.kinds) > 1

    def __str__(self) -> str:
        return self.name
