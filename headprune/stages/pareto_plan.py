"""What a pruning-for-speed run will make, from its settings alone: recoveries, rearrangements, steps and the names of its points."""

from omegaconf import OmegaConf

from headprune.results.points import recovery_steps
from headprune.selection.mask_search import PruneTarget, given_target
from headprune.selection.schedule import check_schedule
from headprune.settings import listed
from headprune.sources.point_models import CONTROL_POINT, point_id
from headprune.stages.pareto_points import step_label


def plain(value):
    """A setting as plain Python values (OmegaConf containers resolved)."""
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def recoveries_of(settings) -> list[str]:
    """``prune.recover`` as a list of recoveries, each a step (none | lsq | reconstruct | finetune) or a chain ``a+b``."""
    return [str(r) for r in listed(settings.recover)]


def steps_used(recoveries) -> frozenset[str]:
    """Every step any of the recoveries runs (a setting of lsq, reconstruct or finetune is read when its step is here)."""
    return frozenset(step for recovery in recoveries for step in recovery_steps(str(recovery)))


def rearrangements_of(settings) -> list[bool]:
    """``prune.rearrange`` (its values checked before work) as the variants to make: false -> [False], true -> [True], both -> [False, True]."""
    return [False, True] if settings.rearrange == "both" else [bool(settings.rearrange)]


def for_speed(settings) -> bool:
    """Whether ``prune`` asks for pruning for speed (a target, a schedule, a recovery, a rearrangement, measured speed or extra splits)."""
    return (
        given_target(settings.target) is not None
        or settings.schedule is not None
        or recoveries_of(settings) != ["none"]
        or rearrangements_of(settings) != [False]
        or bool(settings.measure_speed)
        or bool(settings.extra_splits)
    )


def pareto_steps(settings, fractions: list[float]) -> list:
    """The steps of every order: ``prune.schedule``, else the one ``prune.target``, else the fractions above 0."""
    target = given_target(settings.target)
    if settings.schedule is not None:
        return check_schedule(plain(settings.schedule))
    if target is not None:
        return [PruneTarget.from_config(plain(target))]
    return [f for f in fractions if f > 0]


def point_label(label: str, recovery: str) -> str:
    """``fisher+lsq@40%`` from a step label ``fisher/40%`` (``order[+rearrange]/step``) and its recovery."""
    method, step = label.split("/", 1)
    return point_id(method if recovery == "none" else f"{method}+{recovery}", step)


def planned_points(settings, orders: list[str], fractions: list[float]) -> list[str]:
    """The names of every point the settings make (``method@step``, in the run's order), the control's last."""
    steps = pareto_steps(settings, fractions)
    variants = [False] if settings.schedule is not None else rearrangements_of(settings)
    names = [
        point_label(f"{order}{'+rearrange' if rearrange else ''}/{step_label(step)}", recovery)
        for order in orders
        for rearrange in variants
        for recovery in recoveries_of(settings)
        for step in steps
    ]
    return [*names, CONTROL_POINT] if settings.control else names
