"""The kvpress / DuoAttention pattern writer: the TSV read back as kvpress reads it gives the pattern, bad input is refused."""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest
import torch
from tiny_llms import tiny_llama

from headprune.export.kvpress import (
    CONFIG,
    TSV,
    kv_shape,
    pattern_from_streamed,
    write_kvpress_pattern,
    write_run_pattern,
)


def read_kvpress_pattern(folder) -> tuple[np.ndarray, dict]:
    """(pattern (layers, KV heads), config) as DuoAttention's loader reads them (tab-separated floats clipped to [0, 1])."""
    pattern = np.clip(np.loadtxt(folder / TSV, dtype=float, delimiter="\t", ndmin=2), 0, 1)
    return pattern, json.loads((folder / CONFIG).read_text())


def kvpress_streaming_mask(text: str, ratio: float) -> np.ndarray:
    """kvpress 0.5.5 DuoAttentionPress: the TSV parsed as its loader does, the round(ratio * size) lowest streamed."""
    scores = np.clip(np.loadtxt(io.StringIO(text), dtype=float, delimiter="\t"), 0, 1)
    mask = np.zeros(scores.shape, dtype=bool)
    n = round(scores.size * ratio)
    if n > 0:
        mask[np.unravel_index(np.argsort(scores, axis=None)[:n], scores.shape)] = True
    return mask


@pytest.mark.parametrize("fraction", [0.0, 0.3, 1.0])
def test_kvpress_streams_the_written_kv_groups(tmp_path, fraction):
    gen = torch.Generator().manual_seed(0)
    layers, kv_heads = 6, 3
    pattern = (torch.rand(layers, kv_heads, generator=gen) >= fraction).float()
    config = write_kvpress_pattern(tmp_path, pattern, sink=4, window=16, model_name="tiny")
    streaming = kvpress_streaming_mask((tmp_path / TSV).read_text(), config["head_compression_ratio"])
    assert np.array_equal(streaming, pattern.numpy() == 0)
    assert config["streamed_fraction"] == pytest.approx(int((pattern == 0).sum()) / pattern.numel(), abs=1e-12)
    assert pattern_from_streamed(config["streamed"], layers, kv_heads).equal(pattern)  # the JSON names the same groups
    read, saved = read_kvpress_pattern(tmp_path)
    assert np.array_equal(read, pattern.numpy())
    assert (saved["sink_size"], saved["recent_size"], saved["model_name"]) == (4, 16, "tiny")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([TSV, CONFIG])  # no temporary file left behind


def test_trained_gates_round_trip_and_stream_those_below_the_threshold(tmp_path):
    gates = torch.tensor([[0.93, 0.02, 0.51], [0.49, 1.0, 1e-4]], dtype=torch.float64)  # DuoAttention-style alphas
    config = write_kvpress_pattern(tmp_path, gates, sink=2, window=8, model_name="m")
    read, _ = read_kvpress_pattern(tmp_path)
    assert np.array_equal(read, gates.numpy())  # %.18e keeps float64 exactly
    assert config["streamed"] == {"0": [1], "1": [0, 2]}
    streaming = kvpress_streaming_mask((tmp_path / TSV).read_text(), config["head_compression_ratio"])
    assert np.array_equal(streaming, gates.numpy() < 0.5)


def test_a_kv_group_mask_of_a_model_is_written_with_its_shape(tmp_path):
    from headprune.core.attention.gates import HeadGates
    from headprune.core.attention.kv_groups import KVGroupGates

    model = tiny_llama(layers=3, heads=4, kv_heads=2)
    gates = KVGroupGates(HeadGates(model))
    mask = gates.ones()
    mask["dec_self"][1, 0] = 0.0
    assert kv_shape(model.config) == gates.groups["dec_self"]
    config = write_kvpress_pattern(tmp_path, mask, 1, 4, "tiny", shape=kv_shape(model.config))
    gates.remove()
    assert config["streamed"] == {"0": [], "1": [0], "2": []}
    assert json.loads((tmp_path / CONFIG).read_text())["kv_heads"] == 2


BAD_PATTERNS = [
    (torch.ones(4), None, "(layers, KV heads)"),
    (torch.ones(2, 3, 1), None, "(layers, KV heads)"),
    (torch.ones(0, 3), None, "(layers, KV heads)"),
    (torch.ones(3, 2), (3, 3), "the model (layers, KV heads) (3, 3)"),
    (torch.full((2, 2), 1.5), None, "values in [0, 1]"),
    (torch.tensor([[1.0, float("nan")], [1.0, 1.0]]), None, "values in [0, 1]"),
    (torch.ones(3, 1), None, "(one KV head per layer) reads back 1-D in kvpress"),
    (torch.ones(1, 3), None, "(one layer) reads back 1-D in kvpress"),
    ({"dec_self": torch.ones(2, 2), "enc_self": torch.ones(2, 2)}, None, "one attention group"),
]


@pytest.mark.parametrize(("pattern", "shape", "message"), BAD_PATTERNS)
def test_a_bad_pattern_is_one_value_error(tmp_path, pattern, shape, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        write_kvpress_pattern(tmp_path, pattern, 4, 16, "m", shape=shape)
    assert not list(tmp_path.iterdir())  # nothing written


BAD_STREAMED = [
    ({5: [0]}, "layer 5 out of range"),
    ({-1: [0]}, "layer -1 out of range"),
    ([(1, [0]), (1, [2])], "layer 1 given twice"),
    ({"1": [0], 1: [2]}, "layer 1 given twice"),
    ({0: [3]}, r"KV ids \[3\] out of range in layer 0"),
    ({2: [1, 1]}, r"KV ids \[1\] given twice in layer 2"),
    ({0: ["x"]}, "KV id in layer 0 must be an integer"),
    ({"first": [0]}, "layer id of a streamed pattern must be an integer"),
]


@pytest.mark.parametrize(("streamed", "message"), BAD_STREAMED)
def test_a_bad_streamed_row_is_one_value_error(streamed, message):
    with pytest.raises(ValueError, match=message):
        pattern_from_streamed(streamed, layers=4, kv_heads=3)


@pytest.mark.parametrize(("sink", "window", "message"), [(-1, 16, "sink >= 0"), (4, 0, "window >= 1"), (4, 2.5, "window must be")])
def test_bad_sink_or_window_is_refused(tmp_path, sink, window, message):
    with pytest.raises(ValueError, match=message):
        write_kvpress_pattern(tmp_path, torch.ones(2, 2), sink, window, "m")


def test_the_explicit_streaming_mask_reduces_to_the_model_where_nothing_is_hidden():
    """clients/stream_reference.py: nothing streamed, or a window over the whole text, is the model's own attention; in
    kvpress's mode the context positions (full prefill) are too."""
    from clients.stream_reference import StreamMask, streaming

    model = tiny_llama(layers=3, heads=4, kv_heads=2)
    ids = torch.randint(3, 64, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        own = model(input_ids=ids).logits
        scale = own.abs().max()
        everything = torch.ones(3, 2, dtype=torch.bool)
        for mask in (StreamMask(torch.zeros(3, 2, dtype=torch.bool), 2, 3), StreamMask(everything, 0, 20)):
            with streaming(model, mask):
                assert torch.allclose(model(input_ids=ids).logits, own, atol=1e-5 * scale, rtol=0)
        with streaming(model, StreamMask(everything, 2, 3, context=12)):
            prefix = model(input_ids=ids).logits[:, :12]
        assert torch.allclose(prefix, own[:, :12], atol=1e-5 * scale, rtol=0)
    assert model.config._attn_implementation == "sdpa"  # restored


def test_the_explicit_streaming_mask_gives_the_same_logits_with_a_kv_cache():
    from transformers import DynamicCache

    from clients.stream_reference import StreamMask, streaming

    model = tiny_llama(layers=3, heads=4, kv_heads=2)
    ids = torch.randint(3, 64, (1, 20), generator=torch.Generator().manual_seed(2))
    streamed = torch.tensor([[True, False], [False, True], [True, True]])
    for context in (None, 12):
        with torch.no_grad(), streaming(model, StreamMask(streamed, 2, 3, context)):
            whole = model(input_ids=ids).logits
            cache = DynamicCache(config=model.config)
            steps = [model(input_ids=ids[:, :14], past_key_values=cache, use_cache=True).logits]
            steps += [model(input_ids=ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits for t in range(14, 20)]
        assert torch.allclose(torch.cat(steps, 1), whole, atol=1e-5 * whole.abs().max(), rtol=0)


def test_the_gated_model_on_its_stream_cache_answers_as_the_explicit_mask():
    """headprune's side of the kvpress check (StreamGates + StreamCache) gives the explicit mask's greedy tokens."""
    from clients.stream_reference import answers, gated_answers

    class Ids:  # a tokenizer that shows the ids themselves
        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    model = tiny_llama(layers=3, heads=4, kv_heads=2)
    model.generation_config.eos_token_id = None
    g = torch.Generator().manual_seed(3)
    prompts = [{"context_ids": torch.randint(3, 64, (n,), generator=g).tolist(), "question_ids": [5, 6]} for n in (18, 25)]
    streamed = torch.tensor([[True, False], [False, True], [True, True]])
    with torch.no_grad():
        explicit = answers(model, Ids(), prompts, streamed, 2, 4, False, 6)
        gated = gated_answers(model, Ids(), prompts, streamed, 2, 4, False, 6)
    assert gated == explicit


def _stream_run(tmp_path, action="stream", unit="kv_group"):
    """A streaming run's results.json: the importance order at 0 and 0.5 of 2 layers x 3 KV groups, sink 4, window 16."""
    steps = [
        {"fraction": 0.0, "mask": {"dec_self": [[1, 1, 1], [1, 1, 1]]}},
        {"fraction": 0.5, "mask": {"dec_self": [[0, 1, 0], [1, 0, 1]]}},
    ]
    results = {"action": action, "unit": unit, "stream": {"sink": 4, "window": 16}, "orders": {"importance": {"steps": steps}}}
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"config": {"model": {"name": "tiny_llama"}}, "results": results}))
    return path


def test_a_streaming_runs_step_is_written_with_its_sink_and_window(tmp_path):
    config = write_run_pattern(_stream_run(tmp_path), tmp_path / "pattern", "importance", 0.5)
    pattern, read = read_kvpress_pattern(tmp_path / "pattern")
    assert np.array_equal(pattern, np.array([[0, 1, 0], [1, 0, 1]], dtype=float))
    assert (read["sink_size"], read["recent_size"], read["model_name"]) == (4, 16, "tiny_llama") and read == config
    assert read["streamed"] == {"0": [0, 2], "1": [1]} and read["head_compression_ratio"] == 0.5


@pytest.mark.parametrize(
    "action,unit,order,fraction,words",
    [
        ("remove", "kv_group", "importance", 0.5, "this run has prune.action=remove"),
        ("stream", "head", "importance", 0.5, "this run streamed prune.unit=head: use prune.unit=kv_group"),
        ("stream", "kv_group", "duo", 0.5, "the run has no duo order; it has ['importance']"),
        ("stream", "kv_group", "importance", 0.3, "no step at fraction 0.3; its fractions: [0.0, 0.5]"),
    ],
)
def test_a_step_the_run_does_not_hold_is_refused(tmp_path, action, unit, order, fraction, words):
    with pytest.raises(ValueError, match=re.escape(words)):
        write_run_pattern(_stream_run(tmp_path, action, unit), tmp_path / "pattern", order, fraction)
    assert not (tmp_path / "pattern").exists()
