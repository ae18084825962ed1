"""prune.min_units_per_layer is each kind's own: a joint unit with whole layers runs with a floor of one, the layers' stack
keeping one layer and every layer keeping at least one KV group and one neuron, by fractions and by a FLOPs target."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runs import TINY_LM_PRUNE, headprune

from headprune.results.run_dir import mask_from_json

JOINT = [*TINY_LM_PRUNE, "prune.unit=[kv_group,ffn,layer]", "prune.order=importance", "prune.min_units_per_layer=1"]


def _masks(results: dict) -> list[dict[str, torch.Tensor]]:
    if "points" in results:
        return [mask_from_json(p["mask"]) for p in results["points"] if p["order"] != "unpruned"]
    return [mask_from_json(step["mask"]) for step in results["orders"]["importance"]["steps"]]


@pytest.mark.parametrize("choice", ["prune.fractions=[0.3,0.9]", "prune.target={flops:0.5}"], ids=["fractions", "target"])
def test_a_layer_unit_leaves_the_per_layer_floor_to_the_width_kinds(capsys, monkeypatch, tmp_path, choice):
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "run", *JOINT, choice)
    assert status == 0, err
    masks = _masks(json.loads((tmp_path / "run" / "results.json").read_text())["results"])
    assert masks
    if choice.startswith("prune.fractions"):  # at 90% of the units layers go, which a floor of one unit per layer forbade
        assert int((masks[-1]["dec_layer"] == 0).sum()) == 1
    for mask in masks:
        assert int(mask["dec_layer"].sum()) >= 1  # the stack keeps a layer
        for group in ("dec_self", "dec_ffn"):
            assert bool((mask[group].sum(1) >= 1).all()), (group, mask[group].sum(1))  # every layer keeps one KV group and neuron
