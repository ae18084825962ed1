"""Measured latency cost models in any pruning unit: the whole model timed with every layer of a group pruned to n units."""

import copy
import hashlib
import json
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.ffn.pruning import ffn_record, prune_neurons
from headprune.core.ffn.sites import find_ffn_sites
from headprune.core.pruning import prune_heads, pruning_record
from headprune.core.unit_kinds import kinds_of, latency_timings, unit_name
from headprune.engine.timing import time_pass
from headprune.selection.costs import CostModel


@dataclass(frozen=True)
class _Timed:
    """What a latency table prunes: its sites, each site's original width, the pruning and the record of earlier pruning."""

    what: str  # "heads", "FFN neurons": named in the refusal of an already pruned model
    find: Callable
    width: Callable
    prune: Callable
    record: Callable


HEADS = _Timed("heads", find_sites, lambda site: site.num_heads_orig, prune_heads, pruning_record)
NEURONS = _Timed("FFN neurons", find_ffn_sites, lambda site: site.width_orig, prune_neurons, ffn_record)


def synthetic_inputs(model: nn.Module, batch_size: int = 1, seq_len: int = 128, seed: int = 0) -> dict:
    """Random token ids (and decoder ids for encoder-decoder models) of a fixed shape, to time a model."""
    generator = torch.Generator().manual_seed(seed)
    vocab = int(model.config.vocab_size)
    inputs = {"input_ids": torch.randint(3, vocab, (batch_size, seq_len), generator=generator)}
    inputs["attention_mask"] = torch.ones_like(inputs["input_ids"])
    if getattr(model.config, "is_encoder_decoder", False):
        inputs["decoder_input_ids"] = torch.randint(3, vocab, (batch_size, seq_len), generator=generator)
    return inputs


def _seconds(model: nn.Module, inputs: dict, device, repeats: int, warmup: int, clock: str) -> float:
    """Median seconds of one forward pass on ``inputs``."""

    def forward(batch):
        model(**batch)

    with torch.inference_mode():
        for _ in range(warmup):
            time_pass(forward, [inputs], device)
        return statistics.median(time_pass(forward, [inputs], device, clock) for _ in range(repeats))


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


def _tables(
    model: nn.Module, inputs: dict, timed: _Timed, points: int | None, device, repeats: int, warmup: int, clock: str
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """({group: [layers, width + 1] s per layer}, unpruned times): a group's layers pruned to each grid width, the rest interpolated."""
    if timed.record(model):
        raise ValueError(f"measure latency tables on the unpruned model: this one already has {timed.what} removed")
    sites = timed.find(model)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    model = model.to(device).eval()
    tables, whole = {}, []
    for group in dict.fromkeys(s.group for s in sites):
        layers = [s for s in sites if s.group == group]
        width = max(timed.width(s) for s in layers)
        grid = list(range(width + 1)) if points is None else width_grid(width, points)
        times = []
        for kept in grid:
            pruned = copy.deepcopy(model)
            timed.prune(pruned, {group: {s.layer: list(range(kept, timed.width(s))) for s in layers}})
            times.append(_seconds(pruned, inputs, device, repeats, warmup, clock))
            del pruned
        whole.append(times[-1])  # every unit kept: the unpruned model
        per_layer = (interpolated(grid, times, width) - times[0]).clamp(min=0) / len(layers)
        per_layer = torch.cummax(per_layer, 0).values  # more units never cost less: keep the table monotone under noise
        tables[group] = per_layer.repeat(max(s.layer for s in layers) + 1, 1)
    return tables, whole


def measure_unit_latency_model(
    model: nn.Module, inputs: dict, unit="head", device="cpu", repeats: int = 5, warmup: int = 1, clock: str = "wall", points: int = 8
) -> CostModel:
    """A seconds CostModel in ``unit`` (model moved to ``device``): every layer of a group timed pruned to n = 0..H heads, or to
    ``points`` neuron widths, made into each kind's tables; ``fixed`` is the rest of the model's time."""
    heads, neurons = latency_timings(unit)
    attention, ffn, info = None, None, {"device": str(device), "clock": clock}
    if heads:
        attention, whole = _tables(model, inputs, HEADS, None, device, repeats, warmup, clock)
        whole = statistics.median(whole)
        info.update(repeats=repeats, input_shapes={k: list(v.shape) for k, v in inputs.items()}, whole_seconds=whole)
        fixed = max(whole - sum(float(table[:, -1].sum()) for table in attention.values()), 0.0)
    if neurons:
        ffn, whole = _tables(model, inputs, NEURONS, points, device, repeats, warmup, clock)
    if not heads:
        fixed = info["whole_seconds"] = statistics.median(whole)  # neurons only: the unpruned model's time
    tables = {g: table for kind in kinds_of(unit) for g, table in kind.latency_tables(attention, ffn, model).items()}
    fixed -= sum(float(t[:, -1].sum()) for t in (ffn or {}).values())
    info.update(unit=unit_name(unit), ffn_points=points)
    return CostModel("seconds", max(fixed, 0.0), tables, info=info)


def cached_unit_latency_model(
    model: nn.Module, inputs: dict, cache_dir: str | Path, unit="head", device="cpu", clock: str = "wall", points: int = 8, **timing
) -> CostModel:
    """The latency cost model of ``unit`` from ``cache_dir/latency-<key>-<unit>.json``, measured and written there the first time (``timing``: the repeats and warmup of ``measure_unit_latency_model``)."""
    name = unit_name(unit)
    config = model.config.to_dict()  # the key hashes what a table depends on: machine, threads, device, architecture, input shapes
    architecture = {
        k: config.get(k) for k in sorted(config) if isinstance(config.get(k), (int, float, str, bool)) and not k.startswith("_")
    }
    device_name = torch.cuda.get_device_name(torch.device(device)) if torch.device(device).type == "cuda" else platform.processor()
    payload = {
        "machine": platform.node(),
        "device": str(device),
        "device_name": device_name,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "clock": clock,
        "class": type(model).__name__,
        "architecture": architecture,
        "inputs": {k: list(v.shape) for k, v in sorted(inputs.items())},
    }
    key = hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]
    path = Path(cache_dir) / f"latency-{key}-{name}-{points}.json"
    if path.exists():
        return CostModel.load(path)
    costs = measure_unit_latency_model(model, inputs, name, device=device, clock=clock, points=points, **timing)
    costs.save(path)
    return costs
