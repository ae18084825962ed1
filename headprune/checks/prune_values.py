"""The prune settings the checks read, parsed once where an experiment's check starts and passed to every rule."""

from dataclasses import dataclass
from functools import cached_property
from typing import Any

from headprune.core.checks import ConfigError, string_list
from headprune.core.kinds.kind_registry import Unit
from headprune.selection.mask_search import PruneTarget, given_target
from headprune.selection.schedule import check_schedule
from headprune.stages.pareto_plan import for_speed, plain, steps_used
from headprune.tasks.stream_task import action_of
from headprune.tasks.unit_task import unit_of


@dataclass(frozen=True)
class PruneValues:
    """prune.* as the checks read it: the unit as its value, the action, and the lists as tuples; ``given``: the group as composed."""

    unit: Unit
    action: str
    orders: tuple[str, ...]
    recoveries: tuple[str, ...]
    groups: tuple[str, ...]
    floor: int
    given: Any

    @classmethod
    def of(cls, cfg) -> "PruneValues":
        """The values of ``cfg.prune``, which the schema has checked, each parsed here once."""
        prune = cfg.prune
        order, recover, groups = (tuple(string_list(prune[key], f"prune.{key}")) for key in ("order", "recover", "groups"))
        return cls(unit_of(cfg), action_of(cfg), order, recover, groups, int(prune.min_units_per_layer), prune)

    @cached_property
    def for_speed(self) -> bool:
        """Whether it prunes for speed (a target, a schedule, a recovery, a rearrangement, measured speed or extra splits)."""
        return for_speed(self.given)

    @cached_property
    def recovering(self) -> frozenset[str]:
        """The recovery steps any listed recovery runs (``reconstruct+finetune`` runs both)."""
        return steps_used(self.recoveries)

    @cached_property
    def steps(self) -> list:
        """The validated steps of prune.target (one) or prune.schedule (growing fractions or targets; [] for neither), or a ConfigError."""
        prune = self.given
        target = given_target(prune.get("target"))
        if target is not None and prune.get("schedule") is not None:
            raise ConfigError("give prune.target or prune.schedule, not both (the schedule's last step is its target)")
        value = plain(prune.get("schedule") if target is None else target)
        if target is not None:
            try:
                return [PruneTarget.from_config(value)]
            except ValueError as err:
                raise ConfigError(f"prune.target: {err}") from None
        if value is None:
            return []
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"prune.schedule must be a list of growing fractions or targets, e.g. [0.2, 0.4], got {value!r}")
        try:
            return check_schedule(value)
        except (ValueError, TypeError) as err:
            raise ConfigError(f"prune.schedule: {err}") from None
