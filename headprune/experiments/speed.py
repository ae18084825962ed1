"""experiment=speed: physically prune the heads a mask removes and compare inference throughput (Table 4).

The mask comes from a ``prune`` results file (``speed.mask_file``, with ``speed.mask_order`` and
``speed.fraction``), a mask JSON ({"mask": {group: [[0/1]]}}), or else the lowest ``speed.fraction``
of heads by importance (training subset). Reports examples/s of the original and pruned models at
each batch size, the measured gain beside the FLOP-ideal gain, parameters, attention FLOPs, and
whether the pruned model scores exactly like the masked one.
"""

from __future__ import annotations

import copy
from dataclasses import asdict
from pathlib import Path

from headprune.core.checks import ConfigError
from headprune.core.counting import model_cost
from headprune.core.gates import HeadGates
from headprune.core.pruning import prune_mask, pruning_record
from headprune.core.saving import load_pruned
from headprune.engine.ablation import attention_implementation
from headprune.engine.timing import TimeBudgetError, mean_length, measure_gain
from headprune.engine.verdict import NOT_TIMED, gain_text
from headprune.experiments.evaluation import SCORE_RTOL, check_split, score_check, score_check_text, swapped_model, unit_counts
from headprune.experiments.mask_source import file_mask, point_mask, point_model_dir, with_file_unit
from headprune.experiments.orders import ORDERS, order_settings
from headprune.experiments.point_models import RECIPE_FILE
from headprune.experiments.settings import RunSettings
from headprune.lightning.loggers import log_run
from headprune.results.mask_files import raw_mask  # noqa: F401  (read here before results/ held it)
from headprune.results.run_dir import mask_to_json, write_results
from headprune.results.writer import output_dir, read_json
from headprune.selection.greedy import check_fractions, heads_removed
from headprune.selection.uniform import layout_masks, layout_of
from headprune.tasks import registry
from headprune.viz.plots import speed_bars
from headprune.viz.tables import speed_rows


def clock_of(settings) -> str:
    """The validated ``speed.clock`` setting: wall (default) or process."""
    clock = str(settings.clock)
    if clock not in ("wall", "process"):
        raise ValueError(f"speed.clock must be wall or process, got {clock!r}")
    return clock


def timed_call(task, model, gates, call=None):
    """The task's timed call (``call``, default ``task.timed_call``) made with ``model`` in place of the task's own."""

    def timed(batch):
        with swapped_model(task, model, gates):
            (call or task.timed_call)(batch)

    return timed


def own_attention(model, gates):
    """Run a block with the model's own attention, or with the gate wrapper where uneven KV groups need its query->KV head map."""
    uneven = any(site.needs_wrapper for site in gates.sites)
    return attention_implementation(model, model.config._attn_implementation if uneven else gates.inner)


def span_of(timed, batches: list[dict]) -> tuple[int, int]:
    """The mean (context before, context after) per row of a timed call over ``batches`` (rows weigh alike)."""
    rows = [b["input_ids"].shape[0] for b in batches]
    spans = [timed.span(b) for b in batches]
    return tuple(max(0, round(sum(n * s[i] for n, s in zip(rows, spans)) / sum(rows))) for i in (0, 1))


def flops_between(model, start: int, end: int) -> int:
    """Forward FLOPs of the tokens from position ``start`` to ``end`` of one row (model_cost(end) - model_cost(start))."""
    return model_cost(model, end).flops - (model_cost(model, start).flops if start else 0)


def memory_rows(task, original, pruned) -> dict:
    """The task's memory measures of both models, with the pruned model's saving and its byte-ideal saving."""
    before, after = task.memory_measures(original), task.memory_measures(pruned)
    out = {
        name: {"original": value, "pruned": after[name], "saving": 1 - after[name] / value if value else None}
        for name, value in before.items()
    }
    for name in [n for n in out if n.endswith("_ideal")]:
        out[name.removesuffix("_ideal")]["byte_ideal_saving"] = out[name]["saving"]
    return out


def speed_stage(task, mask: dict, speed, seed: int, pruned_model=None, export_dir: Path | None = None) -> dict:
    """Throughput of each timed call of the task, original vs physically pruned model, FLOP counts, memory, masked == pruned check.

    ``mask`` is in the unit of ``task.gates`` (query heads or KV groups); the model is pruned by its query-head mask.
    ``speed``: the speed settings (split, batch sizes, repeats, time budget, clock, runtime, check_score).
    ``pruned_model``: time this model instead (``mask``'s heads already removed from it, e.g. after recovery: generation
    speed depends on the weights through the output lengths); it has no masked twin, so no score check.
    ``runtime="onnxruntime"``: both models are exported to ONNX (``export_dir``) and timed in ONNX Runtime; calls the
    graphs cannot make (generation: no KV cache) are left out and listed under ``calls_not_timed``.
    """
    original = task.model
    head_mask = task.gates.head_mask(mask, hard=True)
    if pruned_model is None:
        pruned = copy.deepcopy(original)
        record = prune_mask(pruned, head_mask)
    else:
        pruned, record = pruned_model, pruning_record(pruned_model)
    pruned_gates = HeadGates(pruned)
    out = {
        "split": str(speed.split),
        "device": str(next(original.parameters()).device),
        "heads_total": task.gates.num_heads,
        "heads_pruned": heads_removed(mask),
        **unit_counts(task.gates),
        "query_heads_pruned": heads_removed(head_mask),
        "pruning_record": record,
        "mask": mask_to_json(mask),
    }
    if speed.check_score and pruned_model is None:
        out["score_check"] = checked_scores(task, mask, pruned, pruned_gates, str(speed.split))
    rows, untimed = timing_rows(task, pruned, pruned_gates, speed, seed, export_dir, out)
    measured = rows or untimed
    seq_len = measured[-1]["seq_len"] if measured else mean_length(task.timing_batches(1, int(speed.examples), out["split"], seed=seed))
    out["cost"] = {"original": asdict(model_cost(original, seq_len)), "pruned": asdict(model_cost(pruned, seq_len))}
    memory = memory_rows(task, original, pruned)
    if memory:
        out["memory"] = memory
        for name, row in memory.items():
            print(f"{name}: original {row['original']}, pruned {row['pruned']} (saving {100 * (row['saving'] or 0):.1f}%)", flush=True)
    out["rows"] = rows
    if untimed:
        out["not_timed"] = untimed
    if not rows:
        out["verdict"] = NOT_TIMED
    return out


def checked_scores(task, mask: dict, pruned, pruned_gates, split: str) -> dict:
    """The masked and the physically pruned model's scores on ``split``; a RuntimeError when they differ beyond rounding."""
    masked = task.evaluate(mask, split=split)
    with swapped_model(task, pruned, pruned_gates):
        physical = task.evaluate(None, split=split)
    check = score_check(masked, physical)
    print(score_check_text(check), flush=True)
    if not check["agree"]:
        raise RuntimeError(
            f"the physically pruned model does not score like the masked one: {score_check_text(check)}; "
            "pruning changed more than the masked heads (set speed.check_score=false to time it anyway)"
        )
    return check


def timing_rows(task, pruned, pruned_gates, speed, seed: int, export_dir, out: dict) -> tuple[list[dict], list[dict]]:
    """(a row per batch size and timed call, the ones the time budget cut); ONNX Runtime's info goes into ``out``."""
    original = task.model
    device = next(original.parameters()).device
    clock = clock_of(speed) if device.type == "cpu" else "wall"
    timed_calls = task.timed_calls()
    rows, untimed = [], []
    with own_attention(original, task.gates), own_attention(pruned, pruned_gates):
        runners = {"original": original, "pruned": pruned}
        if speed.runtime == "onnxruntime":
            runners, out["runtime"] = onnx_runners(task, runners, str(speed.split), seed, export_dir, timed_calls)
        skipped = out["runtime"]["calls_not_timed"] if "runtime" in out else {}
        for size in [int(b) for b in speed.batch_sizes]:  # both timed with the models' own attention where they can do without gates
            batches = task.timing_batches(size, int(speed.examples), str(speed.split), seed=seed)
            for name, timed in [(n, t) for n, t in timed_calls.items() if n not in skipped]:
                span = span_of(timed, batches)
                calls = (
                    timed_call(task, runners["original"], task.gates, timed.call),
                    timed_call(task, runners["pruned"], pruned_gates, timed.call),
                )
                try:
                    timing = measure_gain(*calls, batches, int(speed.warmup), int(speed.repeats), device, clock, **adaptive_settings(speed))
                except TimeBudgetError as error:  # a slow machine: this row is not timed, everything else stands
                    untimed.append(
                        {"batch_size": size, "seq_len": span[1] - span[0], "call": name, "unit": timed.unit, "verdict": NOT_TIMED}
                        | {"reason": str(error)}
                    )
                    print(f"batch {size:3d} {name}: {NOT_TIMED} ({error})", flush=True)
                    continue
                rows.append(timing_row(timed, name, size, span, batches, timing, original, pruned))
    return rows, untimed


def timing_row(timed, name: str, size: int, span: tuple[int, int], batches: list[dict], timing: dict, original, pruned) -> dict:
    """One row of the speed table: both timings, the gain beside its FLOP-ideal, per-unit rates; printed as it is made."""
    start, end = span
    ideal = flops_between(original, start, end) / flops_between(pruned, start, end) - 1
    gain = timing["gain"]
    per_example = sum(timed.count(b) for b in batches) / sum(b["input_ids"].shape[0] for b in batches)
    for model in ("original", "pruned"):
        timing[model]["units_per_s"] = timing[model]["examples_per_s"] * per_example
    print(
        f"batch {size:3d} {name}: original {timing['original']['units_per_s']:.1f} +- "
        f"{timing['original']['spread'] * per_example:.1f} {timed.unit}/s, pruned {timing['pruned']['units_per_s']:.1f} +- "
        f"{timing['pruned']['spread'] * per_example:.1f} {timed.unit}/s, gain {gain_text(timing)} (FLOP-ideal {100 * ideal:+.1f}%; "
        f"{timing['repeats']} repeats, load {timing['load_average']})",
        flush=True,
    )
    return {
        "batch_size": size,
        "seq_len": end - start,
        **timing,
        "flop_ideal_gain": ideal,
        "gain_vs_ideal": gain / ideal if ideal > 0 else None,
        "call": name,
        "unit": timed.unit,
        "context": [start, end],
    }


def onnx_runners(task, models: dict, split: str, seed: int, export_dir: Path | None, timed_calls: dict) -> tuple[dict, dict]:
    """Both models exported to ONNX and loaded into ONNX Runtime (this process's threads), checked against PyTorch on one
    batch; the timed calls the graphs cannot make (generation) are listed, not timed."""
    import torch

    from headprune.export.runtime import onnx_runtime_models

    if export_dir is None:
        raise ValueError("speed.runtime=onnxruntime needs a directory for the ONNX exports")
    example = {k: v.cpu() for k, v in task.timing_batches(4, 4, split, seed=seed)[0].items()}
    runners = onnx_runtime_models(models, example, export_dir, torch.get_num_threads())
    info = {"name": "onnxruntime", "files": {n: str(export_dir / n) for n in models}, "calls_not_timed": {}, "max_abs_diff": {}}
    with torch.no_grad():
        for name, model in models.items():
            expected = model(**{k: v.to(next(model.parameters()).device) for k, v in example.items()}).logits.float().cpu()
            info["max_abs_diff"][name] = float((runners[name](**example).logits - expected).abs().max())
    for call, timed in timed_calls.items():
        try:
            timed_call(task, runners["pruned"], task.gates, timed.call)(example)
        except NotImplementedError as err:
            info["calls_not_timed"][call] = str(err)
            print(f"not timed in ONNX Runtime: {call} ({err})", flush=True)
    return runners, info


def adaptive_settings(settings) -> dict:
    """speed.max_seconds / tolerance / max_repeats as keyword arguments of speed_stage."""
    return {
        "max_seconds": float(settings.max_seconds),
        "tolerance": float(settings.tolerance),
        "max_repeats": int(settings.max_repeats or settings.repeats),
    }


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
    """(the recovered model ``speed.point`` names, the check that it scores its table row on ``split``); (None, None) for no
    point or one without recovery (timed by its mask). ``speed.check_score=false`` skips the check."""
    folder = point_model_dir(settings, "speed") if settings.get("point") else None
    if folder is None:
        return None, None
    model = load_pruned(folder).to(next(task.model.parameters()).device).eval()
    return model, recorded_score_check(task, model, folder, split) if settings.check_score else None


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
    recovered, checked = point_model(cfg.speed, task, split)
    result = speed_stage(task, mask, settings, int(cfg.seed), pruned_model=recovered, export_dir=output_dir(cfg) / "onnx")
    if recovered is not None:
        origin["model"] = str(point_model_dir(cfg.speed, "speed"))
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


def untimed_note(result: dict, max_seconds, prefix: str) -> None:
    """Say at the end of a run which timings the time budget cut (their rows are recorded as not timed)."""
    cut = result.get("not_timed") or []
    if cut:
        which = ", ".join(f"batch {r['batch_size']} {r['call']}" for r in cut)
        print(
            f"{prefix} {NOT_TIMED} ({which}; speed.max_seconds={max_seconds}): every other result is kept; "
            "raise speed.max_seconds to time them",
            flush=True,
        )


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
