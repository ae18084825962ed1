"""experiment=speed (Table 4): physically prune the units a mask removes; throughput, FLOPs and score against the masked model."""

from pathlib import Path

from omegaconf import OmegaConf

from headprune.checks.prune_checks import check_joint_scale
from headprune.checks.prune_values import PruneValues
from headprune.checks.shared_checks import check_exact_pruning, check_model_and_task, check_unit, refuse_given
from headprune.checks.speed_checks import check_removes_some, check_speed_run
from headprune.core.saving import load_pruned
from headprune.core.unit_kinds import is_joint, noun
from headprune.lightning.loggers import log_run
from headprune.measures.evaluation import SCORE_RTOL, check_split, swapped_model
from headprune.measures.speed_stage import speed_stage, untimed_note
from headprune.results.points import kinds_label
from headprune.results.run_claim import flat
from headprune.results.run_dir import write_results
from headprune.results.writer import output_dir, read_json
from headprune.selection.greedy import heads_removed
from headprune.selection.joint_scale import comparable_scores
from headprune.selection.uniform import layout_masks
from headprune.settings import RunSettings
from headprune.sources.mask_source import file_mask, point_mask, point_model_dir, with_file_unit
from headprune.sources.orders import ORDERS, order_settings
from headprune.sources.point_models import RECIPE_FILE
from headprune.tasks import registry
from headprune.tasks.unit_task import unit_of
from headprune.viz.plots import speed_bars
from headprune.viz.tables import speed_rows


def choose_mask(cfg, task) -> tuple[dict, dict]:
    """The mask to prune and where it came from (validated before any timing)."""
    settings = cfg.speed
    fraction = float(settings.fraction)
    if settings.get("point"):
        return point_mask(settings, task, "speed")
    if settings.get("mask_file"):
        return file_mask(settings, task)
    order = str(settings.mask_order)
    scores = comparable_scores(ORDERS[order].scores(task, order_settings(cfg)), str(cfg.prune.joint_scale))
    mask = layout_masks(scores, task.gates.groups, [fraction], layout=str(cfg.prune.layout))[0]
    return mask, {
        "mask_order": order,
        "fraction": fraction,
        "mask_source": f"the lowest {fraction:g} of the {noun(task.gates.unit, plural=True)} by {order}",
    }


UNSCORED_DATA_KEYS = ("batch_size", "eval_batch_size")  # data settings that do not change which examples a split holds


def data_differences(run_data: dict | None, data: dict) -> list[str]:
    """The data settings of this run that differ from the prune run's (``run_data``: its results' config.data), as 'key=here (there)'."""
    if not isinstance(run_data, dict):
        return []
    there, here = flat(run_data), flat(data)
    keys = sorted(k for k in set(there) | set(here) if k.rpartition(".")[2] not in UNSCORED_DATA_KEYS and there.get(k) != here.get(k))
    return [f"data.{k}={here.get(k)} (the prune run's: {there.get(k)})" for k in keys]


def recorded_score_check(task, model, folder: Path, split: str, run_data: dict | None = None, data: dict | None = None) -> dict | None:
    """The loaded model's score on ``split`` vs its recipe.json's: a RuntimeError beyond rounding (naming the data settings that
    differ from the prune run's, ``run_data``, where any do), None when that split was not scored."""
    recorded = (read_json(Path(folder) / RECIPE_FILE).get("scores") or {}).get(split)
    if recorded is None:
        return None
    with swapped_model(task, model):
        loaded = task.evaluate(None, split=split).score
    agree = abs(loaded - recorded) <= SCORE_RTOL * max(abs(loaded), abs(recorded), 1e-12)
    check = {"metric": task.metric, "recorded": recorded, "loaded": loaded, "tolerance": SCORE_RTOL, "agree": bool(agree)}
    print(f"score check ({task.metric}): recorded {recorded:.8g}, saved model {loaded:.8g}: {'agree' if agree else 'differ'}", flush=True)
    if not agree:
        differ = data_differences(run_data, data or {})
        why = (
            f"this run's {split} split is not the prune run's: {', '.join(differ)}; give the prune run's data settings again"
            if differ
            else "it is not the model of that row (was the directory replaced?)"
        )
        raise RuntimeError(
            f"the model saved in {folder} scores {loaded:.8g} on {split}, its prune run recorded {recorded:.8g}: {why}; set "
            "speed.check_score=false to time it anyway"
        )
    return check


def run(cfg) -> dict:
    """Prune physically, time original vs pruned at each batch size, check scores; results.json + figure."""
    cfg = with_file_unit(cfg, "speed")  # a mask file says its own unit (head, kv_group, ffn, block or a joint list)
    settings = RunSettings.of(cfg).speed
    task = registry.load_task(cfg)
    split = str(settings.split)
    check_split(task, split)
    mask, origin = choose_mask(cfg, task)
    where = origin.get("mask_file") or f"speed.fraction={origin.get('fraction')}"
    total = sum(int(m.numel()) for m in mask.values())
    check_removes_some(heads_removed(mask), total, f"the mask of {where}", task.gates.unit)
    folder = point_model_dir(cfg.speed, "speed") if cfg.speed.get("point") else None  # the recovered model speed.point names
    recovered = load_pruned(folder).to(next(task.model.parameters()).device).eval() if folder is not None else None
    checked = None
    if recovered is not None and settings.check_score:
        run_config = read_json(Path(str(cfg.speed.mask_file)).expanduser()).get("config") or {}
        checked = recorded_score_check(
            task, recovered, folder, split, run_config.get("data"), OmegaConf.to_container(cfg.data, resolve=True)
        )
    result = speed_stage(task, mask, settings, int(cfg.seed), pruned_model=recovered, export_dir=output_dir(cfg) / "onnx")
    if recovered is not None:
        origin["model"] = str(folder)
        result["score_check"] = checked
    out = output_dir(cfg)
    removed = origin.get("fraction_removed", origin["fraction"])
    pruned = (
        kinds_label(result["mask"], task.gates.unit)
        if is_joint(task.gates.unit)
        else f"{100 * removed:.0f}% of the {noun(task.gates.unit, plural=True)}"
    )
    title = f"Throughput, {pruned} pruned ({cfg.model.name})"
    figures = [speed_bars(result["rows"], out / "speed.png", title)] if result["rows"] else []
    if origin.get("target"):
        result["target"] = {**origin["target"], "predicted_speedup": origin["predicted_speedup"]}
        print(
            f"target {origin['step']} (predicted {origin['predicted_speedup']:.2f}x): measured "
            + ", ".join(f"batch {r['batch_size']} {1 + r['gain']:.2f}x" for r in result["rows"]),
            flush=True,
        )
    write_results(cfg, "speed", result, task, split, inputs=origin, figures=figures)
    log_run(cfg, "speed", {k: v for k, v in result.items() if k not in ("rows", "mask")}, {"speed": speed_rows(result)}, figures)
    untimed_note(result, settings.max_seconds, "[speed]")
    return {"objective": result["rows"][-1]["gain"] if result["rows"] else None, **result}


def check(cfg) -> None:
    """experiment=speed: the model and task, the unit, speed.* and the mask it times (importance.* only without a mask file)."""
    prune, mask_file = PruneValues.of(cfg), cfg.speed.get("mask_file")
    check_model_and_task(cfg)
    check_unit(cfg, prune)
    if mask_file:
        refuse_given(
            cfg,
            ("importance", "prune.layout", "prune.joint_scale", "prune.ablation_split", "prune.n_samples"),
            "with speed.mask_file the mask comes from the file, not from an order's scores",
        )
    else:
        check_joint_scale(cfg, prune, [str(cfg.speed.mask_order)])
    if not mask_file or Path(str(mask_file)).expanduser().is_file():  # a missing one is told by check_speed_run
        check_exact_pruning(cfg, "its speed measurement times the physically pruned model", unit_of(with_file_unit(cfg, "speed")).kinds)
    check_speed_run(cfg)
