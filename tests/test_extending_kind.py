"""A kind registered from outside headprune (tests/kind_plugin.py) runs experiment=prune, speed and export to ONNX."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runs import TINY_LM_PRUNE, headprune
from kind_plugin import FFNHalfKind
from tiny_llms import lm_batch, tiny_llama

from headprune.core.kinds import register_kind, unregister_kind
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.scoring.importance import per_example_gate_gradients


@pytest.fixture
def halves():
    register_kind(FFNHalfKind())
    yield
    unregister_kind("ffn_half")


def test_an_outside_kind_masks_scores_and_prunes_through_its_registration(halves):
    model, batch = tiny_llama(), lm_batch()
    gates = unit_gates(model, "ffn_half")
    assert gates.groups == {"dec_ffn_half": (3, 2)}
    halves_grads = per_example_gate_gradients(model, gates, batch, unit="ffn_half")["dec_ffn_half"]  # (B, L, 2)
    neurons = per_example_gate_gradients(model, unit_gates(model, "ffn"), batch, unit="ffn")["dec_ffn"]  # (B, L, 64)
    expected = neurons.unflatten(-1, (2, 32)).sum(-1)  # one gate on a half = the sum of its neurons' gates
    torch.testing.assert_close(halves_grads, expected, atol=1e-6 * float(expected.abs().max()), rtol=0)
    mask = {"dec_ffn_half": torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])}
    with gates.masked(mask):
        masked = model(**batch).logits
    prune_unit_mask(gates, mask)
    pruned = model(**batch).logits
    torch.testing.assert_close(pruned, masked, atol=1e-5 * float(masked.abs().max()), rtol=0)
    assert unit_gates(model, "ffn").present()["dec_ffn"].sum(-1).tolist() == [32, 32, 64]


def test_an_outside_kind_runs_prune_speed_and_onnx_export(halves, capsys, monkeypatch, tmp_path):
    run = tmp_path / "prune"
    status, err = headprune(
        capsys, monkeypatch, tmp_path, run, *TINY_LM_PRUNE, "prune.unit=ffn_half", "prune.order=fisher", "prune.fractions=[0.5]"
    )
    assert status == 0, err
    results = json.loads((run / "results.json").read_text())
    steps = results["results"]["orders"]["fisher"]["steps"]
    assert results["results"]["unit"] == "ffn_half" and set(steps[-1]["mask"]) == {"dec_ffn_half"}
    speed = tmp_path / "speed"
    base = [o for o in TINY_LM_PRUNE if o != "experiment=prune"]
    status, err = headprune(
        capsys,
        monkeypatch,
        tmp_path,
        speed,
        *base,
        "experiment=speed",
        f"speed.mask_file={run}/results.json",
        "speed.batch_sizes=[2]",
        "speed.repeats=2",
        "speed.max_repeats=2",
        "speed.warmup=0",
    )
    assert status == 0, err
    export = tmp_path / "export"
    status, err = headprune(
        capsys, monkeypatch, tmp_path, export, *base, "experiment=export", "export.format=onnx", f"export.mask_file={run}/results.json"
    )
    assert status == 0, err
    assert list(export.rglob("*.onnx"))


def test_the_outside_kind_prunes_by_itself_as_its_neurons(halves):
    import copy

    import torch

    from headprune.core.kinds import KINDS

    model = tiny_llama()
    twin = copy.deepcopy(model)
    gates = unit_gates(model, "ffn_half")
    mask = {g: torch.tensor([[1.0, 0.0]] * layers) for g, (layers, _) in gates.groups.items()}
    assert KINDS["ffn_half"].prune(model, mask) == prune_unit_mask(unit_gates(twin, "ffn_half"), mask)["ffn"]
