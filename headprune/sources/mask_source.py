"""The mask of ``speed.mask_file`` / ``export.mask_file``: the file's unit and layout, and the candidate its settings pick."""

import copy

import torch
from omegaconf import open_dict

from headprune.core.checks import ConfigError
from headprune.core.unit_kinds import kinds_of
from headprune.results.mask_files import Candidate, MaskFile, choose_candidate, mask_for_model, read_mask_file
from headprune.results.points import removed_fraction
from headprune.tasks.unit_task import unit_of

PICKS = {"mask_order": str, "fraction": float, "mask_step": str}  # the settings that pick a mask among a file's candidates


def pick_keys(setting: str) -> tuple[str, ...]:
    """The dotted keys of the settings that pick a mask of ``<setting>.mask_file`` (``speed.mask_order`` ...)."""
    return tuple(f"{setting}.{name}" for name in PICKS)


def given_keys() -> set[str] | None:
    """The settings given on the command line (dotted keys), or None outside a Hydra run (then every setting counts as given)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return {str(o).split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task}


def chosen_mask(settings, setting: str) -> tuple[MaskFile, Candidate]:
    """The mask file and the one candidate its settings pick, those given only (a ConfigError listing them when that is not one)."""
    found = read_mask_file(settings.mask_file, setting)
    given = given_keys()
    picks = {
        name: kind(settings[name]) if settings.get(name) is not None and (given is None or f"{setting}.{name}" in given) else None
        for name, kind in PICKS.items()
    }
    return found, choose_candidate(found, picks["mask_order"], picks["fraction"], picks["mask_step"], setting)


def with_file_unit(cfg, setting: str):
    """``cfg`` with prune.unit (and layout) as the mask file records them; another prune.unit given is a ConfigError."""
    settings = cfg.get(setting) or {}
    if not settings.get("mask_file"):
        return cfg
    found = read_mask_file(settings.mask_file, setting)
    if found.unit is None:
        return cfg
    given = given_keys() or set()
    asked = unit_of(cfg)
    if "prune.unit" in given and asked.name != found.unit:
        raise ConfigError(
            f"prune.unit={asked}, but {setting}.mask_file={found.path} holds masks of unit {found.unit}: drop prune.unit "
            "(the file's unit is used)"
        )
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.prune.unit = found.unit
        if found.layout:
            cfg.prune.layout = found.layout
    return cfg


def file_mask(settings, task, setting: str = "speed") -> tuple[dict, dict]:
    """The mask of ``<setting>.mask_file`` in the task's unit, and where it came from (method, step, what it removed)."""
    return _task_mask(settings, task, setting, *chosen_mask(settings, setting), "mask_file")


def _task_mask(settings, task, setting: str, found: MaskFile, chosen: Candidate, source: str) -> tuple[dict, dict]:
    """A file's chosen mask in the task's unit, refused where it removes a token the task's prompts or answers read (the
    vocabulary floor of its prune), and where it came from: the file, method, fraction asked and removed, unit, layout, and a
    Pareto point's step."""
    mask = mask_for_model(found, chosen, task.gates, task.model, setting)
    needed = getattr(task, "needed_token_ids", lambda: [])()
    token_kinds = [kind for kind in kinds_of(task.gates.unit) if kind.renumbers_ids]
    for group, value in mask.items():
        if not needed or not any(kind.owns(group) for kind in token_kinds):
            continue
        kept = torch.as_tensor(value).flatten()
        lost = [i for i in needed if not bool(kept[i])]
        if lost:
            raise ConfigError(
                f"{setting}.{source}: the mask removes {len(lost)} token(s) the {task.name} task's prompts or answers read (ids "
                f"{lost[:8]}): prune again on this task, whose vocabulary floor keeps them"
            )
    total = sum(int(m.numel()) for m in mask.values())
    origin = {
        "mask_file": str(settings.mask_file),
        "mask_order": chosen.method,
        "fraction": chosen.fraction if chosen.fraction is not None else chosen.removed / total,
        "fraction_removed": chosen.removed / total,
        "unit": task.gates.unit,
    }
    if found.layout:
        origin["layout"] = found.layout
    if chosen.point is not None:  # a Pareto point: its target and predicted speed-up are reported beside the measured gain
        point = chosen.point
        origin.update(
            fraction=removed_fraction(point), step=point["step"], target=point.get("target"), predicted_speedup=point["predicted_speedup"]
        )
    return mask, origin if source == "mask_file" else {**origin, "point": str(settings.point)}


def point_source(settings, setting: str) -> tuple[MaskFile, Candidate]:
    """The Pareto point ``<setting>.point`` names in ``<setting>.mask_file`` (a ConfigError listing the file's points)."""
    from headprune.sources.point_models import find_point

    if not settings.get("mask_file"):
        raise ConfigError(f"{setting}.point names a point of a prune run: give {setting}.mask_file=<prune run>/results.json")
    found = read_mask_file(settings.mask_file, setting)
    points = [c.point for c in found.candidates if c.point is not None] + found.controls
    point = find_point(points, str(settings.point), f"{setting}.mask_file={found.path}", setting)
    if point.get("control"):  # unpruned: its model is all there is
        return found, Candidate("control", 0.0, point.get("step"), {}, 0, point)
    return found, next(c for c in found.candidates if c.point is point)


def point_model_dir(settings, setting: str, need_model: bool = False):
    """The model directory of ``<setting>.point`` (None: it kept none; ``need_model``: a ConfigError saying how to take its mask)."""
    if not settings.get("point"):
        return None
    found, chosen = point_source(settings, setting)
    if not chosen.point.get("model_dir"):
        if chosen.point.get("recovery", "none") != "none":
            raise ConfigError(
                f"{setting}.point={settings.point} was recovered ({chosen.point['recovery']}) but its run kept no model "
                "(prune.save): rerun the prune with prune.save=recovered, or export its mask alone with "
                f"{setting}.mask_order / {setting}.mask_step"
            )
        if need_model:
            quoted = "=" in str(chosen.step)  # a step such as speedup=1.3 is quoted on the command line
            step = f"\"{setting}.mask_step='{chosen.step}'\"" if quoted else f"{setting}.mask_step={chosen.step}"
            raise ConfigError(
                f"{setting}.point={settings.point} has no saved model: this point has no recovery and its run did not keep "
                "its model (prune.save=recovered, the default, keeps recovered points only). Take its mask on the base model "
                "instead: "
                f"{setting}.mask_order={chosen.method} {step} (in place of {setting}.point), or rerun the prune with prune.save=all"
            )
        return None
    folder = found.path.parent / chosen.point["model_dir"]
    if not folder.is_dir():
        raise FileNotFoundError(f"{setting}.point={settings.point}: its model directory {folder} is missing")
    return folder


def point_mask(settings, task, setting: str) -> tuple[dict, dict]:
    """The mask of a point without a saved model (recovery none), in the task's unit, and where it came from."""
    return _task_mask(settings, task, setting, *point_source(settings, setting), "point")
