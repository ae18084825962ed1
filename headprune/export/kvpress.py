"""A streaming head pattern as DuoAttention and NVIDIA's kvpress read it: ``full_attention_heads.tsv`` + ``config.json``."""

import io
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np
import torch

from headprune.core.pruning import integer_id
from headprune.core.unit_kinds import shrunk_fields
from headprune.results.writer import read_json, write_json_atomic, write_text_atomic

TSV = "full_attention_heads.tsv"
CONFIG = "config.json"
THRESHOLD = 0.5  # DuoAttention's: a KV head whose value is below is streamed


def kv_shape(config) -> tuple[int, int]:
    """(layers, KV heads per layer) of a decoder's HF config."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    return int(config.num_hidden_layers), int(kv_heads)


def pattern_from_streamed(streamed: Mapping | Iterable, layers: int, kv_heads: int) -> torch.Tensor:
    """The (layers, kv_heads) pattern (1 = full, 0 = streamed) of {layer: [streamed KV ids]} or pairs; a ValueError for bad ids."""
    pattern = torch.ones(layers, kv_heads)
    pairs = streamed.items() if isinstance(streamed, Mapping) else streamed
    seen: set[int] = set()
    for key, ids in pairs:
        layer = integer_id(key, "layer id of a streamed pattern")
        if not 0 <= layer < layers:
            raise ValueError(f"streamed pattern: layer {layer} out of range (the model has layers 0..{layers - 1})")
        if layer in seen:
            raise ValueError(f"streamed pattern: layer {layer} given twice; give each layer once with all of its KV ids")
        seen.add(layer)
        kv_ids = [integer_id(k, f"KV id in layer {layer}") for k in ids]
        bad = [k for k in kv_ids if not 0 <= k < kv_heads]
        if bad:
            raise ValueError(f"streamed pattern: KV ids {bad} out of range in layer {layer} (KV heads 0..{kv_heads - 1})")
        twice = sorted({k for k in kv_ids if kv_ids.count(k) > 1})
        if twice:
            raise ValueError(f"streamed pattern: KV ids {twice} given twice in layer {layer}")
        pattern[layer, kv_ids] = 0.0
    return pattern


def check_pattern(pattern, shape: tuple[int, int] | None = None) -> np.ndarray:
    """A pattern as a float64 (layers, kv_heads) array in [0, 1] from an array or a one-group KV-group mask; else a ValueError."""
    if isinstance(pattern, Mapping):
        if len(pattern) != 1:
            raise ValueError(f"a KV-group mask for kvpress holds one attention group (a decoder's), got {sorted(pattern)}")
        pattern = next(iter(pattern.values()))
    array = np.asarray(pattern.detach().cpu().double() if torch.is_tensor(pattern) else pattern, dtype=np.float64)
    if array.ndim != 2 or 0 in array.shape:
        raise ValueError(f"a kvpress pattern is (layers, KV heads), one value per KV head; got shape {tuple(array.shape)}")
    if shape is not None and tuple(array.shape) != tuple(shape):
        raise ValueError(f"the pattern has shape {tuple(array.shape)}, the model (layers, KV heads) {tuple(shape)}")
    if 1 in array.shape:
        raise ValueError(
            f"a kvpress pattern of shape {tuple(array.shape)} (one {'KV head per layer' if array.shape[1] == 1 else 'layer'}) reads "
            "back 1-D in kvpress and DuoAttention (numpy.loadtxt squeezes a single column or row), and kvpress then streams "
            "nothing: their files hold models with several layers and several KV heads per layer"
        )
    if not np.isfinite(array).all() or array.min() < 0 or array.max() > 1:
        raise ValueError("a kvpress pattern holds values in [0, 1] (1 = full attention, 0 = streamed); got values outside")
    return array


def write_kvpress_pattern(out: str | Path, pattern, sink: int, window: int, model_name: str, shape=None) -> dict:
    """Write ``full_attention_heads.tsv`` and ``config.json`` into ``out`` (each atomically); the config written."""
    array = check_pattern(pattern, shape)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(
            f"write_kvpress_pattern writes the pattern into a directory; {out} is a file: give a new or existing directory"
        )
    sink, window = integer_id(sink, "sink"), integer_id(window, "window")
    if sink < 0 or window < 1:
        raise ValueError(f"sink >= 0 and window >= 1 tokens (kvpress reads recent_size 0 as no streaming); got {sink}, {window}")
    streamed = {layer: [int(k) for k in np.flatnonzero(row < THRESHOLD)] for layer, row in enumerate(array)}
    fraction = sum(map(len, streamed.values())) / array.size
    config = {
        "sink_size": sink,
        "recent_size": window,
        "model_name": str(model_name),
        "layers": int(array.shape[0]),
        "kv_heads": int(array.shape[1]),
        "streamed": {str(layer): ids for layer, ids in streamed.items()},
        "streamed_fraction": fraction,
        "head_compression_ratio": fraction,  # kvpress DuoAttentionPress: streams this share of the lowest values
        "threshold": THRESHOLD,
    }
    text = io.StringIO()
    np.savetxt(text, array, delimiter="\t")  # as duo_attn.utils.save_full_attention_heads
    write_text_atomic(out / TSV, text.getvalue())
    write_json_atomic(out / CONFIG, config)  # last: a directory with config.json holds both files
    return config


def write_run_pattern(results_file: str | Path, out: str | Path, order: str, fraction: float, model_name: str | None = None) -> dict:
    """Write the pattern of ``order`` at ``fraction`` of a ``prune.action=stream`` run with its sink and window."""
    results_file, out = Path(results_file), Path(out)
    if results_file.is_dir():
        inside = f" (did you mean {results_file / 'results.json'}?)" if (results_file / "results.json").is_file() else ""
        raise ValueError(f"write_run_pattern takes a streaming run's results.json, got the directory {results_file}{inside}")
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"write_run_pattern writes the pattern into a directory; {out} is a file: give a new or existing directory")
    payload = read_json(results_file)
    results = payload.get("results") or {}
    if results.get("action") != "stream":
        raise ValueError(
            f"a kvpress pattern is a streaming run's (prune.action=stream); this run has prune.action={results.get('action', 'remove')}"
        )
    if "num_key_value_heads" not in shrunk_fields(results.get("unit")):
        raise ValueError(
            f"a kvpress pattern holds one value per KV head; this run streamed prune.unit={results.get('unit')}: use prune.unit=kv_group"
        )
    orders = results.get("orders") or {}
    if order not in orders:
        raise ValueError(f"the run has no {order} order; it has {sorted(orders)}")
    steps = orders[order]["steps"]
    step = next((s for s in steps if abs(float(s["fraction"]) - float(fraction)) < 1e-9), None)
    if step is None:
        raise ValueError(f"the {order} order has no step at fraction {fraction}; its fractions: {[s['fraction'] for s in steps]}")
    stream = results["stream"]
    name = model_name or (payload.get("config") or {}).get("model", {}).get("name") or "model"
    return write_kvpress_pattern(out, step["mask"], int(stream["sink"]), int(stream["window"]), str(name))
