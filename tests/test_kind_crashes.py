"""Kind combinations and settings that once crashed mid-run: each now runs correctly, or is refused in one line before work."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from cli_runs import TINY_LM_PRUNE, headprune
from tiny_llms import causal_lm_loss, lm_batch, tiny_llama

from headprune.core.units import unit_gates
from headprune.scoring.importance import importance_scores


def _prune(capsys, monkeypatch, tmp_path, *overrides: str) -> tuple[int, str, dict | None]:
    """experiment=prune on the tiny Llama: (exit status, stderr, results or None)."""
    run = tmp_path / "run"
    status, err = headprune(capsys, monkeypatch, tmp_path, run, *TINY_LM_PRUNE, *overrides)
    found = run / "results.json"
    return status, err, json.loads(found.read_text())["results"] if found.exists() else None


def _refused(status: int, err: str, *words: str) -> None:
    """Exit 2 with one line naming ``words``, no traceback."""
    assert status == 2 and "Traceback" not in err, err[-2000:]
    assert all(word in err for word in words), err[-2000:]


@pytest.mark.parametrize("other", ["layer", "hidden"])
def test_blocks_scored_beside_another_kind_are_the_blocks_scored_alone(other):
    """A joint unit of blocks and layers (or channels) scores each block as blocks alone do: blocks claim only their own sites."""
    model, batch = tiny_llama(), lm_batch()
    unit = ["block", other]
    joint = importance_scores(model, unit_gates(model, unit), [batch], loss_fn=causal_lm_loss, unit=unit, normalize_layers=False)
    alone = importance_scores(model, unit_gates(model, "block"), [batch], loss_fn=causal_lm_loss, unit="block", normalize_layers=False)
    assert set(alone) < set(joint)
    for group, scores in alone.items():
        torch.testing.assert_close(joint[group], scores, rtol=1e-5, atol=1e-6 * float(scores.abs().max()))


@pytest.mark.parametrize("unit", ["[layer,block]", "[block,hidden]"])
def test_joint_units_with_blocks_run(capsys, monkeypatch, tmp_path, unit):
    status, err, results = _prune(capsys, monkeypatch, tmp_path, f"prune.unit={unit}", "prune.fractions=[0.3]")
    assert status == 0, err[-2000:]
    assert any(group.endswith("_block") for group in results["orders"]["importance"]["steps"][0]["mask"])


@pytest.mark.parametrize("unit", ["ffn", "layer", "[kv_group,ffn]"])
def test_latency_tables_of_every_kind_that_has_them(tmp_path, unit):
    """prune.cost=latency times the model's own attention under gates of any kind: the tables cover the unit's groups."""
    from types import SimpleNamespace

    from headprune.core.attention.gates import own_attention_name
    from headprune.stages.pareto_measure import cost_model

    model = tiny_llama()
    gates = unit_gates(model, unit.strip("[]").split(","))
    before = model.config._attn_implementation
    settings = SimpleNamespace(cost="latency", seq_len=8, latency_batch_size=2)
    costs = cost_model(SimpleNamespace(model=model, gates=gates), settings, tmp_path)
    assert costs.unit == "seconds" and costs.groups == gates.groups
    assert all(bool((t >= 0).all()) and bool((t.diff(dim=1) >= 0).all()) for t in costs.tables.values())  # more kept, no faster
    assert model.config._attn_implementation == before and own_attention_name(model) == own_attention_name(tiny_llama())


def test_a_latency_target_of_layers_runs(capsys, monkeypatch, tmp_path):
    """Layers timed on this machine meet the target, or (timings of a tiny model) it is said unmet in one line."""
    status, err, results = _prune(capsys, monkeypatch, tmp_path, "prune.unit=layer", "prune.cost=latency", "prune.target={speedup:1.05}")
    if status == 2:
        _refused(status, err, "target speedup=1.05 cannot be met")
    else:
        assert status == 0, err[-2000:]
        assert results["points"][1]["predicted_speedup"] >= 1.05 - 1e-9


@pytest.mark.parametrize("unit", ["hidden", "[layer,hidden]"])
def test_a_latency_cost_of_a_kind_without_latency_tables_is_refused(capsys, monkeypatch, tmp_path, unit):
    status, err, _ = _prune(capsys, monkeypatch, tmp_path, f"prune.unit={unit}", "prune.cost=latency", "prune.target={speedup:1.2}")
    _refused(status, err, "prune.cost=latency", "hidden units have no latency tables")


@pytest.mark.parametrize("task,unit", [("lm", "kv_group"), ("lm", "ffn"), ("lm", "layer"), ("nli", "hidden")])
def test_an_int8_onnx_export_of_any_kinds_mask(capsys, monkeypatch, tmp_path, task, unit):
    """The int8 check scores the ONNX exports of a non-head mask at each batch size; the f32 export scores as the masked model."""
    from experiment_helpers import NLI

    data = {"lm": [o for o in TINY_LM_PRUNE if not o.startswith("experiment=")], "nli": [*NLI, "logger=none"]}[task]
    prune = (*data, "experiment=prune", f"prune.unit={unit}", "prune.fractions=[0.5]")
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "prune", *prune)
    assert status == 0, err[-2000:]
    export = ("experiment=export", "export.format=onnx", "export.quantize=int8", "export.examples=4", "export.batch_size=2")
    mask_file = f"export.mask_file={tmp_path / 'prune' / 'results.json'}"
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "export", *data, *export, mask_file, "speed.batch_sizes=[1,3]")
    assert status == 0, err[-2000:]
    result = json.loads((tmp_path / "export" / "results.json").read_text())["results"]
    quantized = result["quantized"]
    assert result["unit"] == unit and quantized["by_batch_size"]["int8"]["batch_sizes"] == [1, 3]
    one_example = 100 / 60 if task == "nli" else 1e-4 * quantized["masked_torch"]  # accuracy: one of 60 flips; perplexity: rounding
    assert quantized["onnx_f32"] == pytest.approx(quantized["masked_torch"], abs=one_example + 1e-9)


def _kept_per_group(mask: dict) -> dict[str, int]:
    return {group: sum(v for row in rows for v in row) for group, rows in mask.items()}


@pytest.mark.parametrize("unit", ["layer", "hidden", "[layer,hidden]"])
def test_no_selection_empties_a_layer_stack_or_the_residual_stream(unit):
    """Removing every unit in order, by fraction or by the cost search, still keeps one layer per stack and one channel."""
    from headprune.selection.greedy import greedy_mask, ranked_heads
    from headprune.selection.mask_search import removal_order
    from headprune.selection.unit_costs import unit_flops_cost_model

    model = tiny_llama()
    kinds = unit.strip("[]").split(",")
    shape = unit_gates(model, kinds).groups
    scores = {g: torch.rand(layers, units, generator=torch.Generator().manual_seed(0)) for g, (layers, units) in shape.items()}
    total = sum(layers * units for layers, units in shape.values())
    everything = greedy_mask(ranked_heads(scores, list(shape)), shape, total)
    assert all(kept == 1 for kept in _kept_per_group({g: m.tolist() for g, m in everything.items()}).values())
    order = removal_order(scores, unit_flops_cost_model(model, kinds, seq_len=8))
    assert len(order) == total - len(shape)  # every unit but one per group is removable, and no more
    assert {g: sum(1 for group, _, _ in order if group == g) for g in shape} == {g: n * u - 1 for g, (n, u) in shape.items()}


def test_a_flops_target_past_the_layer_floor_is_refused_before_work(capsys, monkeypatch, tmp_path):
    overrides = ("prune.unit=layer", "prune.target={flops:0.3}", "prune.measure_speed=true")
    status, err, results = _prune(capsys, monkeypatch, tmp_path, *overrides)
    _refused(status, err, "target flops=0.3 cannot be met", "a layer stack and the residual stream keep one")
    assert results is None


def test_a_max_drop_target_of_layers_keeps_a_layer(capsys, monkeypatch, tmp_path):
    status, err, results = _prune(capsys, monkeypatch, tmp_path, "prune.unit=layer", "prune.target={max_drop:1000}")
    assert status == 0, err[-2000:]
    point = results["points"][1]
    assert all(kept >= 1 for kept in _kept_per_group(point["mask"]).values()) and point["units_removed"] == point["units_total"] - 1


@pytest.mark.parametrize(
    "unit,fractions,removed,met",
    [
        ("layer", "[0,0.25,0.75]", [0, 0, 1], [True, False, True]),  # 2 layers: 25% rounds down to none, 75% to one
        ("hidden", "[0.5,0.99]", [16, 28], [True, False]),  # 32 channels: 99% keeps one multiple of the 4 heads, unmet
        ("[layer,hidden]", "[0.99]", [29], [False]),  # asks 33 of 34: a layer and one multiple of 4 channels stay
    ],
)
def test_fractions_round_down_to_whole_units_and_say_when_unmet(capsys, monkeypatch, tmp_path, unit, fractions, removed, met):
    from headprune.core.checks import ConfigWarning
    from headprune.results.points import step_label

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status, err, results = _prune(capsys, monkeypatch, tmp_path, f"prune.unit={unit}", f"prune.fractions={fractions}")
    assert status == 0, err[-2000:]
    steps = results["orders"]["importance"]["steps"]
    assert [s["units_removed"] for s in steps] == removed and [s["fraction_met"] for s in steps] == met
    assert all(kept >= 1 for s in steps for kept in _kept_per_group(s["mask"]).values())
    assert [("asked" in step_label(s)) for s in steps] == [not m for m in met]
    said = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning) and "rounds down to whole" in str(w.message)]
    assert len(said) == (0 if all(met) else 1), said
