"""The models a prune run's recovery made, kept in ``<run>/models/<point>/`` (``prune.save``) and found again by name."""

import copy
import dataclasses
import json
import re
from pathlib import Path

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError
from headprune.core.saving import load_pruned, save_pruned
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.models.tokenizer_origin import keep_origin
from headprune.results.points import recovery_steps
from headprune.results.writer import fresh_dir, replace_dir

MODELS_DIR = "models"
RECIPE_FILE = "recipe.json"
SAVE_CHOICES = ("recovered", "all", "none")  # or a list of point names
CONTROL_POINT = "control@0%"  # the control's model ("unpruned + same training" in the tables)
CONTROL_NAMES = (CONTROL_POINT, "unpruned + same training@0%", "control")


def check_save(save, pareto: bool, planned: list[str] | None = None) -> None:
    """``prune.save``: recovered, all, none, or point names (``name@step``), each once and each one of ``planned`` (when known)."""
    if isinstance(save, str):
        if save not in SAVE_CHOICES:
            raise ConfigError(
                f"prune.save={save!r}: choose one of {', '.join(SAVE_CHOICES)}, or a list of point names (fisher+finetune@40%)"
            )
        listed = []
    else:
        listed = [str(s) for s in save]
        bad = [s for s in listed if "@" not in s]
        if bad or not listed:
            raise ConfigError(f"prune.save lists {bad or 'nothing'}: name points as their table does, method@step (fisher+finetune@40%)")
        twice = sorted({s for s in listed if listed.count(s) > 1})
        if twice:
            raise ConfigError(f"prune.save lists {twice} more than once: remove the repeats")
    if not pareto and (listed or save == "all"):
        raise ConfigError(
            "prune.save keeps the models of Pareto points (prune.recover, target, schedule, rearrange or measure_speed): "
            "a plain pruning curve keeps none; drop prune.save"
        )
    unknown = [s for s in listed if planned is not None and _canonical(s) not in planned]
    if unknown:
        raise ConfigError(
            f"prune.save lists {', '.join(unknown)}, which this run does not make: its settings make {', '.join(planned)}; "
            "name some of these (or prune.save=all)"
        )


def _canonical(name: str) -> str:
    """A point name as ``point_id`` writes it (the control's other names as ``control@0%``)."""
    return CONTROL_POINT if name in CONTROL_NAMES else name


def point_id(name: str, step: str) -> str:
    """A point's name as its table and ``export.point`` write it: ``fisher+finetune@40%``, ``importance+lsq@speedup=1.3``."""
    return f"{name}@{step}"


def point_slug(point: str) -> str:
    """The directory name of a point (``fisher+finetune@40%`` -> ``fisher+finetune@40pct``)."""
    return re.sub(r"[^A-Za-z0-9+@=._-]", "_", point.replace("%", "pct"))


def wants_model(save, recovery: str, point: str) -> bool:
    """Whether ``prune.save`` keeps this point's model: ``recovered`` (recovered points), ``all``, ``none`` or a list of names."""
    if isinstance(save, str):
        return save == "all" or (save == "recovered" and recovery != "none")
    return point in {_canonical(str(s)) for s in save}


def recipe_of(ctx, point: str, order_name: str, recovery: str, step: str, mask_json) -> dict:
    """What makes a point's model: the point, its mask, recovery and the settings recovery reads."""
    prune = ctx.settings
    steps = recovery_steps(recovery)  # a chain (reconstruct+finetune) records each step's settings
    settings = _step_settings(prune, steps[0]) if len(steps) == 1 else {step: _step_settings(prune, step) for step in steps}
    return {
        "point": point,
        "order": order_name,
        "recovery": recovery,
        "step": step,
        "seed": ctx.seed,
        "recover_examples": int(prune.recover_examples),
        "settings": settings,
        "mask": mask_json,
    }


def _step_settings(prune, step: str):
    """The settings one recovery step reads, as plain JSON values (None for none)."""
    from headprune.selection.lsq import SHRINKS

    settings = {"lsq": prune.lsq, "reconstruct": prune.reconstruct, "finetune": prune.finetune}.get(step)
    if OmegaConf.is_config(settings):
        settings = OmegaConf.to_container(settings, resolve=True)
    elif dataclasses.is_dataclass(settings):
        settings = json.loads(json.dumps(dataclasses.asdict(settings), default=str))
    if step == "lsq":  # the shrinks tried are part of how the model was made (an older lsq tried none)
        settings = {**settings, "shrinks": list(SHRINKS)}
    return settings


def saved_dir(recipe: dict) -> str:
    """Where a recipe's model lives, relative to the run directory."""
    return f"{MODELS_DIR}/{point_slug(recipe['point'])}"


def saved_model(out: Path, recipe: dict):
    """The model saved for this recipe by an earlier run in ``out`` (None: none, made another way, or damaged: named, then recomputed)."""
    folder = Path(out) / saved_dir(recipe)
    try:
        earlier = json.loads((folder / RECIPE_FILE).read_text())
    except (OSError, ValueError):
        return None  # none saved, or its recipe unreadable
    if {k: v for k, v in earlier.items() if k != "scores"} != json.loads(json.dumps(recipe)):
        return None  # made another way (scores aside)
    try:
        model = load_pruned(folder)
    except (OSError, ValueError, RuntimeError) as err:
        print(f"[prune] the saved model of {recipe['point']} ({folder}) cannot be loaded ({err}): computing it again", flush=True)
        return None
    print(f"[prune] reusing the saved model of {recipe['point']} ({folder})", flush=True)
    return model


def save_point_model(out: Path, model, gates, mask, tokenizer, recipe: dict, scores: dict) -> str:
    """Write a point's model (physically pruned: a mask still applied is pruned from a copy) atomically; its relative path."""
    if mask is not None:
        model = copy.deepcopy(model)
        prune_unit_mask(unit_gates(model, gates.unit), mask)
    models = Path(out) / MODELS_DIR
    slug = point_slug(recipe["point"])
    staging = fresh_dir(models / f".{slug}.next")
    save_pruned(model, staging, tokenizer=tokenizer)
    keep_origin(tokenizer, staging)  # where the tokenizer came from (an embedded model's GGUF pre-tokenizer), for the GGUF export
    (staging / RECIPE_FILE).write_text(json.dumps({**recipe, "scores": scores}, indent=1, default=str))
    replace_dir(staging, models / slug)
    return saved_dir(recipe)


def point_names(points: list[dict]) -> list[str]:
    """The names of a run's points (``point_id``), in the run's order."""
    return [name for name, _ in _named(points)]


def _named(points: list[dict]) -> list[tuple[str, dict]]:
    """(``point_id`` of its table name and step, or ``control@0%``; the point) of a run's points but the plain unpruned one."""
    from headprune.results.points import point_name

    named = [p for p in points if p.get("order") != "unpruned" or p.get("control")]
    return [(CONTROL_POINT if p.get("control") else point_id(point_name(p), str(p.get("step"))), p) for p in named]


def find_point(points: list[dict], name: str, source: str, setting: str = "export") -> dict:
    """The point of a run called ``name`` (point_id, directory or the control's table name), else a ConfigError listing the run's points."""
    for full, p in _named(points):
        if name in (CONTROL_NAMES if p.get("control") else (full,)) or name == point_slug(full):
            return p
    listed = ", ".join(point_names(points)) or "none"
    raise ConfigError(f"{setting}.point={name}: {source} has no such point; its points are: {listed}")
