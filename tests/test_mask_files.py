"""A mask file says its own unit, layout and candidates: export and speed read them, and ask only among several."""

from __future__ import annotations

import json

import pytest
from cli_runs import headprune
from experiment_helpers import LM, NLI

from headprune.core.checks import ConfigError
from headprune.results.mask_files import choose_candidate, read_mask_file

LLAMA = [*LM, "data.tokenizer.vocab_size=300", "logger=none", "device=cpu"]
ONNX = ["experiment=export", "export.format=onnx", "export.examples=4", "export.batch_size=4"]


@pytest.fixture
def kv_run(capsys, monkeypatch, tmp_path):
    """A fisher-only prune run of KV groups, uniform, at one fraction (a third of the groups: one of two per layer)."""
    run_dir = tmp_path / "prune"
    overrides = ["experiment=prune", "prune.unit=kv_group", "prune.layout=uniform", "prune.order=fisher", "prune.fractions=[0.5]"]
    status, err = headprune(capsys, monkeypatch, tmp_path, run_dir, *LLAMA, *overrides)
    assert status == 0, err
    return run_dir / "results.json"


def test_export_of_a_kv_group_run_reads_unit_order_and_fraction_from_the_file(kv_run, capsys, monkeypatch, tmp_path):
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "export", *LLAMA, *ONNX, f"export.mask_file={kv_run}")
    assert status == 0, err
    result = json.loads((tmp_path / "export" / "results.json").read_text())
    assert result["results"]["unit"] == "kv_group" and result["results"]["check"]["passed"]
    assert result["inputs"]["mask_order"] == "fisher" and result["inputs"]["layout"] == "uniform"
    assert result["results"]["heads_per_layer"] == [[2, 1]]  # 2 query heads over 1 KV head left in each layer
    # the export's results.json is itself a mask file: speed reads its one mask
    status, err = headprune(
        capsys, monkeypatch, tmp_path, tmp_path / "speed", *LLAMA, "experiment=speed", f"speed.mask_file={tmp_path / 'export' / 'results.json'}",
        "speed.batch_sizes=[2]", "speed.examples=2", "speed.warmup=0", "speed.repeats=1", "speed.max_repeats=2",
    )  # fmt: skip
    assert status == 0, err
    speed = json.loads((tmp_path / "speed" / "results.json").read_text())
    assert speed["results"]["unit"] == "kv_group" and speed["results"]["mask"] == result["results"]["mask"]


def test_a_unit_given_against_the_file_is_refused(kv_run, capsys, monkeypatch, tmp_path):
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "e", *LLAMA, *ONNX, f"export.mask_file={kv_run}", "prune.unit=head")
    assert status == 2 and "holds masks of unit kv_group" in err, err


def test_several_candidates_are_listed_with_the_settings_that_pick_each(capsys, monkeypatch, tmp_path):
    run_dir = tmp_path / "prune"
    status, err = headprune(
        capsys,
        monkeypatch,
        tmp_path,
        run_dir,
        *NLI,
        "logger=none",
        "device=cpu",
        "experiment=prune",
        "prune.order=[importance,random]",
        "prune.step=0.5",
    )
    assert status == 0, err
    mask = f"export.mask_file={run_dir / 'results.json'}"
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "e", *NLI, "logger=none", *ONNX, mask)
    assert status == 2 and "holds 2 masks: pick one" in err, err
    assert "export.mask_order=importance export.fraction=0.5" in err and "export.mask_order=random export.fraction=0.5" in err, err
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "e", *NLI, "logger=none", *ONNX, mask, "export.mask_order=random")
    assert status == 0, err
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "z", *NLI, "logger=none", *ONNX, mask, "export.fraction=0")
    assert status == 2 and "export.fraction=0 prunes no head" in err, err


def write(path, text: str):
    path.write_text(text)
    return path


@pytest.mark.parametrize("text,words", [("", "is empty"), ('{"results": {"orders": {"fis', "is not valid JSON")])
def test_an_empty_or_truncated_mask_file_is_a_damaged_input(tmp_path, text, words):
    with pytest.raises(ConfigError) as err:
        read_mask_file(write(tmp_path / "m.json", text), "export")
    message = str(err.value)
    assert words in message and "export.mask_file=" in message and '{"mask": {group:' in message and "delete" not in message


def test_a_mask_json_and_a_study_file_are_read_alike(tmp_path):
    mask = {"enc_self": [[1, 0], [1, 1]]}
    found = read_mask_file(write(tmp_path / "m.json", json.dumps({"mask": mask})), "speed")
    assert choose_candidate(found, "importance", 0.5, None, "speed").mask == mask  # one mask: the settings pick nothing
    steps = [{"fraction": 0.0, "mask": {"enc_self": [[1, 1], [1, 1]]}}, {"fraction": 0.25, "mask": mask}]
    study = {"results": {"prune": {"unit": "head", "layout": "global", "orders": {"importance": {"steps": steps}}}}}
    found = read_mask_file(write(tmp_path / "s.json", json.dumps(study)), "speed")
    assert (found.unit, found.layout) == ("head", "global")
    assert choose_candidate(found, None, None, None, "speed").fraction == 0.25  # the only step that removes a head
