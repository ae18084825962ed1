"""prune.hidden_multiple: the kept residual width rounds to a multiple the model's config takes (down for a cost or a fraction,
up for max_drop), so the saved points build as stock models and export; from the command line their widths are multiples."""

from __future__ import annotations

import json

import torch
from cli_runs import TINY_LM_PRUNE, headprune
from conftest import tiny_bert
from tiny_llms import tiny_llama
from transformers import AutoConfig

from headprune.core.saving import load_pruned
from headprune.results.run_dir import mask_from_json
from headprune.selection.kept_widths import round_kept_widths, width_multiples

UNIT = "kv_group+ffn+hidden"


def _mask(kept: list[int]) -> dict[str, torch.Tensor]:
    row = torch.zeros(1, 12)
    row[0, kept] = 1.0
    return {"hidden": row, "dec_self": torch.tensor([[1.0, 0.0], [1.0, 1.0]])}


def test_rounding_down_drops_the_lowest_kept_and_up_restores_the_highest_removed():
    scores = {"hidden": torch.arange(12.0).unsqueeze(0), "dec_self": torch.ones(2, 2)}
    mask = _mask([0, 3, 5, 7, 9, 10, 11])  # 7 kept
    down = round_kept_widths(mask, scores, {"hidden": 4}, UNIT)
    up = round_kept_widths(mask, scores, {"hidden": 4}, UNIT, up=True)
    assert down["hidden"][0].nonzero().flatten().tolist() == [7, 9, 10, 11]  # 7 -> 4: channels 0, 3, 5 (lowest scores) go too
    assert up["hidden"][0].nonzero().flatten().tolist() == [0, 3, 5, 7, 8, 9, 10, 11]  # 7 -> 8: channel 8 (best removed) back
    assert torch.equal(down["dec_self"], mask["dec_self"]) and torch.equal(up["dec_self"], mask["dec_self"])
    few = round_kept_widths(_mask([4, 5]), scores, {"hidden": 4}, UNIT)  # below one multiple: one multiple, not none
    assert few["hidden"][0].nonzero().flatten().tolist() == [4, 5, 10, 11]
    whole = _mask(list(range(12)))
    assert torch.equal(round_kept_widths(whole, scores, {"hidden": 5}, UNIT)["hidden"], whole["hidden"])  # the original width stays


def test_the_multiple_is_the_configs_rule_and_the_settings_lcm():
    llama, bert = tiny_llama(), tiny_bert()  # Llama's config refuses a hidden_size off the multiples of its 4 heads; BERT's takes any
    assert width_multiples(llama, UNIT, {"hidden_multiple": None}) == {"hidden": 4}
    assert width_multiples(llama, UNIT, {"hidden_multiple": 6}) == {"hidden": 12}
    assert width_multiples(llama, "kv_group+ffn", {"hidden_multiple": 8}) == {}
    assert width_multiples(bert, "hidden", {"hidden_multiple": None}) == {}
    assert width_multiples(bert, "hidden", {"hidden_multiple": 8}) == {"hidden": 8}


def _points(run) -> list[dict]:
    return [p for p in json.loads((run / "results.json").read_text())["results"]["points"] if p["order"] != "unpruned"]


def test_saved_points_keep_widths_the_config_builds(capsys, monkeypatch, tmp_path):
    runs = {
        "joint": ["prune.unit=[kv_group,ffn,hidden]", "prune.target={flops:0.5}"],
        "lsq": ["prune.unit=hidden", "prune.fractions=[0.1]", "prune.recover=reconstruct", "prune.hidden_multiple=8"],
    }
    for name, extra in runs.items():
        status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / name, *TINY_LM_PRUNE, "prune.save=all", *extra)
        assert status == 0, err
        (point,) = _points(tmp_path / name)
        kept = int(mask_from_json(point["mask"])["hidden"].sum())
        multiple = 8 if name == "lsq" else 4
        assert kept % multiple == 0 and kept < 32, kept
        if name == "lsq":
            assert kept == 24  # 10% of 32 asked: 29 kept, rounded down
        saved = tmp_path / name / point["model_dir"]  # relative to the run directory
        model = load_pruned(saved)
        assert model.config.hidden_size == kept
        AutoConfig.from_pretrained(saved).validate()  # what stock transformers and the exporters build from
