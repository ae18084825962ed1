"""experiment=speed: physically prune the heads a mask removes and compare inference throughput (Table 4).

The mask comes from a ``prune`` results file (``speed.mask_file``, with ``speed.mask_order`` and
``speed.fraction``), a mask JSON ({"mask": {group: [[0/1]]}}), or else the lowest ``speed.fraction``
of heads by importance (training subset). Reports examples/s of the original and pruned models at
each batch size, the measured gain beside the FLOP-ideal gain, parameters, attention FLOPs, and
whether the pruned model scores exactly like the masked one.
"""

from __future__ import annotations

from pathlib import Path

from headprune.core.checks import ConfigError
from headprune.core.gates import HeadGates
from headprune.core.saving import load_pruned
from headprune.experiments.evaluation import SCORE_RTOL, check_split, swapped_model
from headprune.experiments.mask_source import file_mask, point_mask, point_model_dir, with_file_unit
from headprune.experiments.orders import ORDERS, order_settings
from headprune.experiments.point_models import RECIPE_FILE
from headprune.experiments.settings import RunSettings
from headprune.experiments.speed_stage import (
    clock_of,
    speed_stage,
    untimed_note,
)
from headprune.lightning.loggers import log_run
from headprune.results.mask_files import raw_mask  # noqa: F401  (read here before results/ held it)
from headprune.results.run_dir import write_results
from headprune.results.writer import output_dir, read_json
from headprune.selection.greedy import check_fractions, heads_removed
from headprune.selection.uniform import layout_masks, layout_of
from headprune.tasks import registry
from headprune.viz.plots import speed_bars
from headprune.viz.tables import speed_rows


def choose_mask(cfg, task) -> tuple[dict, dict]:
    """The mask to prune and where it came from (validated before any timing)."""
    settings = cfg.speed
    fraction = check_fractions([settings.fraction])[0]
    if settings.get("point"):
        return point_mask(settings, task, "speed")
    if settings.get("mask_file"):
        return file_mask(settings, task)
    order = str(settings.mask_order)
    if order not in ORDERS:
        raise ConfigError(f"speed.mask_order={order} is no pruning order ({list(ORDERS)}); a Pareto point's method needs speed.mask_file")
    scores = ORDERS[order].scores(task, order_settings(cfg))
    mask = layout_masks(scores, task.gates.groups, [fraction], layout=layout_of(cfg.prune))[0]
    return mask, {"mask_order": order, "fraction": fraction, "mask_source": f"the lowest {fraction:g} of the heads by {order}"}


def point_model(settings, task, split: str) -> tuple:
    """(the recovered model ``speed.point`` names, the check that it scores its table row on ``split``, its directory);
    (None, None, None) for no point or one without recovery (timed by its mask). ``speed.check_score=false`` skips the check."""
    folder = point_model_dir(settings, "speed") if settings.get("point") else None
    if folder is None:
        return None, None, None
    model = load_pruned(folder).to(next(task.model.parameters()).device).eval()
    return model, recorded_score_check(task, model, folder, split) if settings.check_score else None, folder


def recorded_score_check(task, model, folder: Path, split: str) -> dict | None:
    """The loaded model's score on ``split`` against the one its prune run recorded (``recipe.json``); a RuntimeError when
    they differ beyond rounding, None when the run did not score that split."""
    recorded = (read_json(Path(folder) / RECIPE_FILE).get("scores") or {}).get(split)
    if recorded is None:
        return None
    with swapped_model(task, model, HeadGates(model)):
        loaded = task.evaluate(None, split=split).score
    agree = abs(loaded - recorded) <= SCORE_RTOL * max(abs(loaded), abs(recorded), 1e-12)
    check = {"metric": task.metric, "recorded": recorded, "loaded": loaded, "tolerance": SCORE_RTOL, "agree": bool(agree)}
    print(f"score check ({task.metric}): recorded {recorded:.8g}, saved model {loaded:.8g}: {'agree' if agree else 'differ'}", flush=True)
    if not agree:
        raise RuntimeError(
            f"the model saved in {folder} scores {loaded:.8g} on {split}, its prune run recorded {recorded:.8g}: it is not the "
            "model of that row (was the directory replaced?); set speed.check_score=false to time it anyway"
        )
    return check


def check_removes_some(mask: dict, origin: dict) -> None:
    """Timing a mask that removes no head, or every head, compares nothing: a ConfigError naming where it came from."""
    removed, total = heads_removed(mask), sum(int(m.numel()) for m in mask.values())
    where = origin.get("mask_file") or f"speed.fraction={origin.get('fraction')}"
    if removed == 0:
        raise ConfigError(f"the mask of {where} removes no head: the two timed models would be the same; prune some heads")
    if removed == total:
        raise ConfigError(f"the mask of {where} removes every head ({total}): nothing would be left to time; keep some heads")


def run(cfg) -> dict:
    """Prune physically, time original vs pruned at each batch size, check scores; results.json + figure."""
    cfg = with_file_unit(cfg, "speed")  # a mask file says its own unit (head or kv_group)
    settings = RunSettings.of(cfg).speed
    check_fractions([settings.fraction])
    clock_of(settings)
    sizes = [int(b) for b in settings.batch_sizes]
    if not sizes or min(sizes) < 1:
        raise ValueError(f"speed.batch_sizes must be positive integers, got {list(settings.batch_sizes)}")
    task = registry.load_task(cfg)
    split = str(settings.split)
    check_split(task, split)
    mask, origin = choose_mask(cfg, task)
    check_removes_some(mask, origin)
    recovered, checked, folder = point_model(cfg.speed, task, split)
    result = speed_stage(task, mask, settings, int(cfg.seed), pruned_model=recovered, export_dir=output_dir(cfg) / "onnx")
    if recovered is not None:
        origin["model"] = str(folder)
        result["score_check"] = checked
    out = output_dir(cfg)
    removed = origin.get("fraction_removed", origin["fraction"])
    title = f"Throughput, {100 * removed:.0f}% of the {task.gates.unit}s pruned ({cfg.model.name})"
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


READS = ("speed", "importance", "prune.unit", "prune.layout", "prune.ablation_split", "prune.n_samples")


def check(cfg) -> None:
    """experiment=speed: the model and task, the unit, speed.* and the mask it times (importance.* only without a mask file)."""
    from headprune.experiments.shared_checks import check_exact_pruning, check_model_and_task, check_reads, check_unit, refuse_given

    check_model_and_task(cfg)
    check_reads(cfg, READS)
    if cfg.speed.get("mask_file"):
        refuse_given(
            cfg,
            ("importance", "prune.layout", "prune.ablation_split", "prune.n_samples"),
            "with speed.mask_file the mask comes from the file, not from an order's scores",
        )
    check_unit(cfg)
    check_exact_pruning(cfg, "its speed measurement times the physically pruned model")
    check_speed_run(cfg)


def check_speed(speed) -> None:
    """speed.* timing: at least as many repeats allowed as asked for, batch sizes listed once."""
    from headprune.experiments.shared_checks import no_duplicates

    no_duplicates(speed.batch_sizes, "speed.batch_sizes")
    if speed.repeats > speed.max_repeats:
        raise ConfigError(
            f"speed.repeats={speed.repeats} timed passes at least, but speed.max_repeats={speed.max_repeats} at most: "
            f"raise speed.max_repeats to {speed.repeats} or more, or lower speed.repeats"
        )


def check_speed_run(cfg) -> None:
    """experiment=speed (and the study's speed stage): timing, the mask settings, the split and the chosen mask."""
    from headprune.experiments.shared_checks import check_splits
    from headprune.results.readers import check_mask_file

    speed = cfg.speed
    check_speed(speed)
    check_splits(cfg, [speed.split], "speed.split")
    if speed.get("point"):
        check_point(cfg)
        return
    if speed.get("mask_file"):
        check_mask_file(speed.mask_file)
        check_chosen_mask(cfg)
        return
    if speed.get("mask_step") is not None:
        raise ConfigError(
            f"speed.mask_step={speed.mask_step} picks a Pareto point of speed.mask_file, which is not set: "
            "add speed.mask_file=<prune run>/results.json or drop speed.mask_step"
        )
    if speed.mask_order not in ORDERS:
        raise ConfigError(
            f"speed.mask_order={speed.mask_order}: without speed.mask_file the mask is the lowest speed.fraction of the heads "
            f"by an order of {list(ORDERS)}; a Pareto point's method (e.g. fisher+lsq) needs speed.mask_file"
        )
    if speed.fraction == 0:
        raise ConfigError("speed.fraction=0 prunes no head: the two timed models would be the same; give a fraction in (0, 1), e.g. 0.5")


def check_point(cfg) -> None:
    """speed.point: a point of speed.mask_file's prune run, picked by name alone; one that removed some heads (not the control)."""
    from headprune.experiments.mask_source import point_source
    from headprune.experiments.shared_checks import refuse_given
    from headprune.results.readers import check_mask_file

    speed = cfg.speed
    refuse_given(cfg, ("speed.mask_order", "speed.mask_step", "speed.fraction"), f"speed.point={speed.point} names the point itself")
    if not speed.get("mask_file"):
        raise ConfigError(f"speed.point={speed.point} names a point of a prune run: give speed.mask_file=<prune run>/results.json")
    check_mask_file(speed.mask_file)
    point = point_source(speed, "speed")[1].point
    if point.get("control"):
        raise ConfigError(
            f"speed.point={speed.point} is the control, the unpruned model fine-tuned: it has the unpruned model's shape, so "
            "timing it against the unpruned model compares nothing; name a pruned point"
        )
    point_model_dir(speed, "speed")  # a recovered point's model directory must be there


def check_chosen_mask(cfg) -> None:
    """The mask speed.mask_file / mask_order / fraction / mask_step pick: present, fitting the model, removing some heads but not all."""
    from headprune.experiments.mask_source import chosen_mask, with_file_unit
    from headprune.experiments.shared_checks import check_mask_units

    speed = cfg.speed
    path = Path(str(speed.mask_file))
    mask = chosen_mask(speed, "speed")[1].mask
    check_mask_units(with_file_unit(cfg, "speed"), mask)
    entries = [value for rows in mask.values() for row in rows for value in row]
    if 0 not in entries:
        raise ConfigError(f"speed.mask_file={path}: the chosen mask removes no head: the two timed models would be the same")
    if 1 not in entries:
        raise ConfigError(
            f"speed.mask_file={path}: the chosen mask removes every head ({len(entries)}): nothing would be left to time "
            "(as speed.fraction=1 is refused); choose a mask that keeps some heads"
        )
