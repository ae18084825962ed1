"""prune.ffn_multiple: every pruned FFN layer keeps a multiple of neurons, the removed neurons with the highest scores
restored; from the command line the points' FFN widths are multiples and hold the unrounded masks' neurons."""

from __future__ import annotations

import json

import torch
from cli_runs import TINY_LM_PRUNE, headprune

from headprune.results.run_dir import mask_from_json
from headprune.selection.kept_widths import round_runtime_multiples


def test_rounding_restores_the_best_removed_neurons_up_to_the_multiple():
    scores = {"dec_ffn": torch.tensor([[5.0, 1.0, 4.0, 2.0, 3.0, 0.0, 6.0, 7.0]] * 3), "dec_self": torch.ones(3, 2)}
    mask = {
        "dec_ffn": torch.tensor([[1, 0, 0, 0, 0, 0, 1, 1], [0] * 8, [1, 1, 1, 1, 1, 1, 1, 0]], dtype=torch.float),
        "dec_self": torch.tensor([[1, 0], [1, 1], [0, 1]], dtype=torch.float),
    }
    out = round_runtime_multiples(mask, scores, {"ffn": 4}, "kv_group+ffn")
    assert torch.equal(out["dec_self"], mask["dec_self"])  # attention as it was
    assert out["dec_ffn"][0].tolist() == [1, 0, 1, 0, 0, 0, 1, 1]  # 3 kept -> 4: neuron 2 (score 4) comes back
    assert out["dec_ffn"][1].tolist() == [0] * 8  # an emptied FFN stays empty
    assert out["dec_ffn"][2].tolist() == [1] * 8  # 7 kept -> 8: the layer's width
    expected = [min(8, -(-int(r.sum()) // 4) * 4) if r.sum() else 0 for r in mask["dec_ffn"]]
    assert out["dec_ffn"].sum(1).tolist() == expected
    assert torch.all(out["dec_ffn"] >= mask["dec_ffn"])  # only restores


SMALL = [
    *TINY_LM_PRUNE,
    "prune.unit=[kv_group,ffn]",
    "prune.order=importance",
]


def _widths(step_or_point: dict) -> list[int]:
    return [int(row.sum()) for row in mask_from_json(step_or_point["mask"])["dec_ffn"]]


def test_prune_from_the_command_line_keeps_multiples(capsys, monkeypatch, tmp_path):
    runs = {}
    for name, extra in (("free", []), ("rounded", ["prune.ffn_multiple=8"])):
        status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / name, *SMALL, "prune.fractions=[0.3,0.6]", *extra)
        assert status == 0, err
        runs[name] = json.loads((tmp_path / name / "results.json").read_text())["results"]
    free, rounded = (runs[n]["orders"]["importance"]["steps"] for n in ("free", "rounded"))
    assert any(w % 8 for step in free for w in _widths(step))  # the test would show nothing otherwise
    for before, after in zip(free, rounded):
        kept_before, kept_after = mask_from_json(before["mask"])["dec_ffn"], mask_from_json(after["mask"])["dec_ffn"]
        width = kept_before.shape[1]
        assert _widths(after) == [min(width, -(-w // 8) * 8) for w in _widths(before)]  # 0 stays 0
        assert torch.all(kept_after >= kept_before)  # the unrounded mask's neurons, and a few more
        assert after["mask"]["dec_self"] == before["mask"]["dec_self"]
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "target", *SMALL, "prune.target={flops:0.7}", "prune.ffn_multiple=8")
    assert status == 0, err
    (point,) = [p for p in json.loads((tmp_path / "target" / "results.json").read_text())["results"]["points"] if p["order"] != "unpruned"]
    assert all(w % 8 == 0 for w in _widths(point)), _widths(point)
