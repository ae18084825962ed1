"""A measured latency cost model: the whole model timed with every layer of a group pruned to n heads."""

import copy
import hashlib
import json
import platform
import statistics
from pathlib import Path

import torch
from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.pruning import prune_heads, pruning_record
from headprune.engine.timing import time_pass
from headprune.selection.costs import CostModel


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


def measure_latency_model(
    model: nn.Module, inputs: dict, device="cpu", repeats: int = 5, warmup: int = 1, clock: str = "wall"
) -> CostModel:
    """Time the model with each group's layers pruned to n = 0..H heads; returns a seconds CostModel (model moved to ``device``)."""
    if pruning_record(model):
        raise ValueError("measure latency tables on the unpruned model: this one already has heads removed")
    sites = find_sites(model)
    inputs = {k: v.to(device) for k, v in inputs.items()}
    model = model.to(device).eval()
    tables, attention, whole = {}, 0.0, []
    for group in dict.fromkeys(s.group for s in sites):
        layers = [s for s in sites if s.group == group]
        heads = max(s.num_heads_orig for s in layers)
        times = []
        for kept in range(heads + 1):
            pruned = copy.deepcopy(model)
            prune_heads(pruned, {group: {s.layer: list(range(kept, s.num_heads_orig)) for s in layers}})
            times.append(_seconds(pruned, inputs, device, repeats, warmup, clock))
            del pruned
        whole.append(times[-1])  # every head kept: the unpruned model
        per_layer = (torch.tensor(times, dtype=torch.float64) - times[0]).clamp(min=0) / len(layers)
        per_layer = torch.cummax(per_layer, 0).values  # more heads never cost less: keep the table monotone under noise
        tables[group] = per_layer.repeat(max(s.layer for s in layers) + 1, 1)
        attention += float(tables[group][:, -1].sum())
    whole = statistics.median(whole)
    info = {
        "device": str(device),
        "clock": clock,
        "repeats": repeats,
        "input_shapes": {k: list(v.shape) for k, v in inputs.items()},
        "whole_seconds": whole,
    }
    return CostModel("seconds", max(whole - attention, 0.0), tables, info=info)


def latency_key(model: nn.Module, inputs: dict, device, clock: str = "wall") -> str:
    """A hash of what a latency table depends on: machine, threads, device, architecture and input shapes."""
    config = model.config.to_dict()
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
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def cached_latency_model(
    model: nn.Module, inputs: dict, cache_dir: str | Path, device="cpu", repeats: int = 5, warmup: int = 1, clock: str = "wall"
) -> CostModel:
    """The latency cost model from ``cache_dir/latency-<key>.json``, measured and written there the first time."""
    path = Path(cache_dir) / f"latency-{latency_key(model, inputs, device, clock)}.json"
    if path.exists():
        return CostModel.load(path)
    costs = measure_latency_model(model, inputs, device=device, repeats=repeats, warmup=warmup, clock=clock)
    costs.save(path)
    return costs
