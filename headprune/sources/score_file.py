"""prune.scores_from: the orders' unit scores of an earlier prune run, read instead of computed."""

import json
from pathlib import Path

import torch

from headprune.core.checks import ConfigError

SETTING = "prune.scores_from"


def read_scores(path, orders: list[str], unit: str, action: str) -> dict[str, dict[str, torch.Tensor]]:
    """{order: {group: [L, units]}} from ``path``; a ConfigError when its unit or action differs or an order has no recorded scores."""
    path = Path(str(path))
    if path.is_dir():  # the results block of a results.json, or a ConfigError saying what the file is instead
        inside = f" (did you mean {path / 'results.json'}?)" if (path / "results.json").is_file() else ""
        raise ConfigError(f"{SETTING}={path} is a directory{inside}: give the results.json of an experiment=prune run")
    if not path.is_file():
        raise ConfigError(f"{SETTING}={path}: no such file: give the results.json of an experiment=prune run")
    try:
        payload = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ConfigError(f"{SETTING}={path}: not JSON (line {err.lineno}: {err.msg}): give a prune run's results.json") from err
    results = payload.get("results") if isinstance(payload, dict) else None
    if not isinstance(results, dict) or not isinstance(results.get("orders"), dict):
        raise ConfigError(
            f"{SETTING}={path} holds no pruning curves (results.orders): give the results.json of a plain experiment=prune "
            "run (without prune.target, schedule or recover, whose points hold masks but no scores)"
        )
    theirs = {"unit": str(results.get("unit", "head")), "action": str(results.get("action", "remove"))}
    for name, ours in (("unit", unit), ("action", action)):
        if theirs[name] != ours:
            raise ConfigError(
                f"{SETTING}={path} ranks prune.{name}={theirs[name]}, and this run has prune.{name}={ours}: scores rank "
                f"the units they were computed for (set prune.{name}={theirs[name]}, or score this {name} first)"
            )
    out = {}
    for order in orders:
        curve = results["orders"].get(order)
        if curve is None:
            raise ConfigError(f"{SETTING}={path} has no {order} order (it has {sorted(results['orders'])}): drop it from prune.order")
        if "head_scores" not in curve:
            raise ConfigError(
                f"{SETTING}={path}: its {order} order recorded no scores (it was re-estimated step by step): drop it from "
                "prune.order, or score it again without prune.reestimate"
            )
        out[order] = {group: torch.tensor(values, dtype=torch.float32) for group, values in curve["head_scores"].items()}
    return out


def check_model(path, model, model_name: str | None) -> None:
    """The file scored this model: the model fingerprint it records equals ``model``'s (a ConfigError naming both)."""
    from headprune.results.writer import model_fingerprint

    payload = json.loads(Path(str(path)).read_text())
    theirs = (payload.get("fingerprints") or {}).get("model")
    ours = model_fingerprint(model)
    if theirs and theirs != ours:
        their_name = (payload.get("inputs") or {}).get("model") or "another model"
        raise ConfigError(
            f"{SETTING}={path} scored {their_name} (model fingerprint {theirs}), and this run prunes {model_name or 'a model'} "
            f"(fingerprint {ours}): scores rank the units of the model they were computed on; give a prune run of this model"
        )


def given_scores(path, orders: list[str], task, model_name: str | None = None) -> dict[str, dict[str, torch.Tensor]] | None:
    """The orders' scores in ``path`` (``prune.scores_from``), checked against the task's model and units; None when no file is given."""
    from headprune.results.stream_points import gate_action

    if path is None:
        return None
    check_model(path, task.model, model_name)
    scores = read_scores(path, orders, task.gates.unit, gate_action(task.gates))
    wanted = {group: tuple(size) for group, size in task.gates.groups.items()}
    for order, groups in scores.items():  # one value per unit of the model's groups
        found = {group: tuple(values.shape) for group, values in groups.items()}
        if found != wanted:
            raise ConfigError(
                f"{SETTING}={path}: its {order} scores have the shapes {found}, and this model's units {wanted}: the file "
                "scored another model (give a run of this model, in this unit)"
            )
    print(f"scores of {', '.join(orders)} read from {path}")
    return scores
