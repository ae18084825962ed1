"""The speed measurement itself: a mask's physically pruned model timed against the unpruned one, FLOPs, memory, score check."""

import copy
from dataclasses import asdict
from pathlib import Path

import torch
from torch import nn

from headprune.core.counting import kv_cache_bytes_per_token, model_cost
from headprune.core.ffn.pruning import ffn_record
from headprune.core.ffn.sites import ffn_sites_if_any
from headprune.core.pruning import pruning_record
from headprune.core.unit_kinds import noun
from headprune.core.units import model_gates, prune_unit_mask, query_heads_of, unit_gates
from headprune.engine.ablation import attention_implementation
from headprune.engine.timing import TimeBudgetError, mean_length, measure_gain
from headprune.engine.verdict import NOT_TIMED, beyond_ideal, gain_text
from headprune.measures.evaluation import score_check, score_check_text, swapped_model, unit_counts
from headprune.results.points import units_by_kind
from headprune.results.run_dir import mask_to_json
from headprune.selection.greedy import heads_removed


def timed_call(task, model, gates, call=None):
    """The task's timed call (``call``, default ``task.timed_call``) made with ``model`` in place of the task's own."""

    def timed(batch):
        with swapped_model(task, model, gates):
            (call or task.timed_call)(batch)

    return timed


def own_attention(model, gates):
    """Run a block with the model's own attention, or with the gate wrapper where uneven KV groups need its query->KV head map."""
    heads = unit_gates(gates, "head")  # the query-head gates under gates of any unit
    uneven = any(site.needs_wrapper for site in heads.sites)
    return attention_implementation(model, model.config._attn_implementation if uneven else heads.inner)


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
    """Throughput of each timed call, original vs physically pruned model (or ``pruned_model``), FLOPs, memory, masked == pruned check."""
    original = task.model
    # mask: {group: [L, units]} in task.gates' unit; query_heads: what it sets on each query head
    query_heads = query_heads_of(task.gates, mask, hard=True)
    pruned = copy.deepcopy(original) if pruned_model is None else pruned_model
    if pruned_model is None:
        prune_unit_mask(unit_gates(pruned, task.gates.unit), mask)
    # {group: {layer: [removed original ids]}}: heads by attention group, neurons by FFN group
    record = {**pruning_record(pruned), **(ffn_record(pruned) if ffn_sites_if_any(pruned) else {})}
    pruned_gates = model_gates(pruned)
    out = {
        "split": str(speed.split),
        "device": str(next(original.parameters()).device),
        "units_removed": heads_removed(mask),
        **unit_counts(task.gates),
        "query_heads_removed": heads_removed(query_heads),
        "units_by_kind": units_by_kind(mask_to_json(mask), task.gates.unit),
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
            f"pruning changed more than the masked {noun(task.gates.unit, plural=True)} (set speed.check_score=false to time it anyway)"
        )
    return check


def timing_rows(task, pruned, pruned_gates, speed, seed: int, export_dir, out: dict) -> tuple[list[dict], list[dict]]:
    """(a row per batch size and timed call, the ones the time budget cut); ONNX Runtime's info goes into ``out``."""
    original = task.model
    device = next(original.parameters()).device
    clock = str(speed.clock) if device.type == "cpu" else "wall"  # a GPU is timed by the wall clock; choices checked before work
    timed_calls = task.timed_calls()
    rows, untimed = [], []
    adaptive = dict(
        max_seconds=float(speed.max_seconds), tolerance=float(speed.tolerance), max_repeats=int(speed.max_repeats or speed.repeats)
    )
    with own_attention(original, task.gates), own_attention(pruned, pruned_gates):
        runners = {"original": original, "pruned": pruned}
        if speed.runtime == "onnxruntime":
            runners, out["runtime"] = onnx_runners(task, runners, str(speed.split), seed, export_dir, timed_calls)
        skipped = out["runtime"]["calls_not_timed"] if "runtime" in out else {}
        for size in [int(b) for b in speed.batch_sizes]:  # both timed with the models' own attention where they can do without gates
            batches = task.timing_batches(size, int(speed.examples), str(speed.split), seed=seed)
            for name, timed in [(n, t) for n, t in timed_calls.items() if n not in skipped]:
                span = span_of(timed, batches)
                calls = [
                    timed_call(task, runners[m], gates, timed.call) for m, gates in (("original", task.gates), ("pruned", pruned_gates))
                ]
                try:
                    timing = measure_gain(*calls, batches, int(speed.warmup), int(speed.repeats), device, clock, **adaptive)
                except TimeBudgetError as error:  # a slow machine: this row is not timed, everything else stands
                    row = {"batch_size": size, "seq_len": span[1] - span[0], "call": name, "unit": timed.unit, "verdict": NOT_TIMED}
                    untimed.append({**row, "reason": str(error)})
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
    bandwidth = decode_bandwidth_ideal(original, pruned, start, end) if name == "decode" else None
    beyond = beyond_ideal(timing, ideal) or (bandwidth is not None and beyond_ideal(timing, bandwidth))
    print(
        f"batch {size:3d} {name}: original {timing['original']['units_per_s']:.1f} +- "
        f"{timing['original']['spread'] * per_example:.1f} {timed.unit}/s, pruned {timing['pruned']['units_per_s']:.1f} +- "
        f"{timing['pruned']['spread'] * per_example:.1f} {timed.unit}/s, gain {gain_text(timing)} (FLOP-ideal {100 * ideal:+.1f}%"
        f"{'' if bandwidth is None else f', bandwidth-ideal {100 * bandwidth:+.1f}%'}"
        f"{', exceeded beyond the interval: to explain before reporting' if beyond else ''}; "
        f"{timing['repeats']} repeats, {timing['threads']} threads, load {timing['load_average']})",
        flush=True,
    )
    return {
        "batch_size": size,
        "seq_len": end - start,
        **timing,
        "flop_ideal_gain": ideal,
        "gain_vs_ideal": gain / ideal if ideal > 0 else None,
        "bandwidth_ideal_gain": bandwidth,  # decode: bytes read per new token (decode_bandwidth_ideal)
        "above_ideal": beyond,
        "call": name,
        "unit": timed.unit,
        "context": [start, end],
    }


def onnx_runners(task, models: dict, split: str, seed: int, export_dir: Path | None, timed_calls: dict) -> tuple[dict, dict]:
    """Both models exported to ONNX, loaded in ONNX Runtime, checked against PyTorch on one batch; calls the graphs cannot make listed."""
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


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes of weights one decoded token reads: every parameter once, an untied input embedding one row."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # shared (tied) parameters counted once
    embedding = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embedding is not None and (output is None or output.weight is not embedding):
        total -= (embedding.shape[0] - 1) * embedding.shape[1] * embedding.element_size()
    return total


def decode_bandwidth_ideal(original: nn.Module, pruned: nn.Module, start: int, end: int) -> float:
    """(weights + KV cache at the mean context) read per token, original over pruned, - 1, for new tokens ``start`` .. ``end`` - 1."""
    context = (start + end + 1) / 2
    reads = [weight_bytes_per_token(m) + kv_cache_bytes_per_token(m) * context for m in (original, pruned)]
    return reads[0] / reads[1] - 1
