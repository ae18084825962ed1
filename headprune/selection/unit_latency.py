"""Measured latency tables in any pruning unit: the attention tables of ``headprune.selection.latency`` and FFN tables."""

import copy
import statistics
from pathlib import Path

import torch
from torch import nn

from headprune.core.ffn.pruning import ffn_record, prune_neurons
from headprune.core.ffn.sites import find_ffn_sites
from headprune.core.unit_kinds import kinds_of, latency_timings, unit_name
from headprune.selection.costs import CostModel
from headprune.selection.latency import _seconds, latency_key, measure_latency_model


def width_grid(width: int, points: int) -> list[int]:
    """0 and ``points`` widths spread up to ``width`` (all of them when ``points`` >= width)."""
    return sorted({round(width * i / max(points, 1)) for i in range(max(points, 1) + 1)} | {0, width})


def interpolated(grid: list[int], values: list[float], width: int) -> torch.Tensor:
    """Values at every width 0..``width`` (width + 1,), linear between the grid's widths."""
    x = torch.arange(width + 1, dtype=torch.float64)
    xs, ys = torch.tensor(grid, dtype=torch.float64), torch.tensor(values, dtype=torch.float64)
    right = torch.searchsorted(xs, x).clamp(1, len(xs) - 1)
    left = right - 1
    share = (x - xs[left]) / (xs[right] - xs[left])
    return ys[left] + share * (ys[right] - ys[left])


def measure_ffn_latency_tables(
    model: nn.Module, inputs: dict, device="cpu", repeats: int = 5, warmup: int = 1, clock: str = "wall", points: int = 8
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """({FFN group: [layers, neurons + 1] seconds}, the unpruned model's times): each group's blocks timed at the grid's widths."""
    if ffn_record(model):
        raise ValueError("measure latency tables on the unpruned model: this one already has FFN neurons removed")
    sites = find_ffn_sites(model)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    model = model.to(device).eval()
    tables, whole = {}, []
    for group in dict.fromkeys(s.group for s in sites):
        layers = [s for s in sites if s.group == group]
        width = max(s.width_orig for s in layers)
        grid = width_grid(width, points)
        times = []
        for kept in grid:
            pruned = copy.deepcopy(model)
            prune_neurons(pruned, {group: {s.layer: list(range(kept, s.width_orig)) for s in layers}})
            times.append(_seconds(pruned, inputs, device, repeats, warmup, clock))
            del pruned
        whole.append(times[-1])
        per_layer = (interpolated(grid, times, width) - times[0]).clamp(min=0) / len(layers)
        per_layer = torch.cummax(per_layer, 0).values
        tables[group] = per_layer.repeat(max(s.layer for s in layers) + 1, 1)
    return tables, whole


def measure_unit_latency_model(
    model: nn.Module, inputs: dict, unit="head", device="cpu", repeats: int = 5, warmup: int = 1, clock: str = "wall", points: int = 8
) -> CostModel:
    """A seconds CostModel in ``unit``: attention and FFN tables made into each kind's tables; ``fixed`` is the rest of the model's time."""
    kinds = kinds_of(unit)
    heads, neurons = latency_timings(unit)
    attention = None
    if heads:
        attention = measure_latency_model(model, inputs, device=device, repeats=repeats, warmup=warmup, clock=clock)
    ffn, whole = None, []
    if neurons:
        ffn, whole = measure_ffn_latency_tables(model, inputs, device, repeats, warmup, clock, points)
    tables = {}
    for kind in kinds:
        tables.update(kind.latency_tables(attention.tables if attention is not None else None, ffn, model))
    info = dict(attention.info or {}) if attention is not None else {"device": str(device), "clock": clock}
    fixed = attention.fixed if attention is not None else statistics.median(whole)  # neurons only: the unpruned model's time
    if attention is None:
        info["whole_seconds"] = fixed
    fixed -= sum(float(t[:, -1].sum()) for t in (ffn or {}).values())
    info.update(unit=unit_name(unit), ffn_points=points)
    return CostModel("seconds", max(fixed, 0.0), tables, info=info)


def cached_unit_latency_model(
    model: nn.Module,
    inputs: dict,
    cache_dir: str | Path,
    unit="head",
    device="cpu",
    repeats: int = 5,
    warmup: int = 1,
    clock: str = "wall",
    points: int = 8,
) -> CostModel:
    """The latency cost model of ``unit`` from ``cache_dir/latency-<key>-<unit>.json``, measured and written there the first time."""
    name = unit_name(unit)
    key = latency_key(model, inputs, device, clock)
    path = Path(cache_dir) / f"latency-{key}-{name}-{points}.json"
    if path.exists():
        return CostModel.load(path)
    costs = measure_unit_latency_model(model, inputs, name, device=device, repeats=repeats, warmup=warmup, clock=clock, points=points)
    costs.save(path)
    return costs
