"""A prune run keeps what recovery made: models/<point>/ loads to the score its row shows, and export.point ships it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runs import headprune as cli_run
from experiment_helpers import LM, NLI, compose_cfg

pytestmark = pytest.mark.slow  # real prune runs with fine-tunes through the command line

FAST = ["logger=none", "device=cpu"]
TUNE = ["prune.finetune.max_steps=3", "prune.finetune.progress=false", "prune.recover_examples=32"]  # read by the prune run
RUNS = {
    "bert": [*NLI, "experiment=prune", "prune.order=importance", "prune.fractions=0.5", "prune.recover=[none,finetune]"],
    "llama": [
        *LM,
        "experiment=prune",
        "prune.unit=kv_group",
        "prune.layout=uniform",
        "prune.order=importance",
        "prune.fractions=0.5",
        "prune.recover=finetune",
    ],
}


def run(capsys, monkeypatch, tmp_path, run_dir, *overrides):
    status, err = cli_run(capsys, monkeypatch, tmp_path, run_dir, *FAST, *TUNE, *overrides)
    assert status == 0, err
    return json.loads((run_dir / "results.json").read_text())


def recovered_points(payload: dict) -> list[dict]:
    return [p for p in payload["results"]["points"] if p.get("recovery") == "finetune" and not p.get("control")]


@pytest.mark.parametrize("family", ["bert", "llama"])
def test_recovered_model_is_kept_scores_its_row_and_exports(family, capsys, monkeypatch, tmp_path):
    from headprune.core.saving import load_pruned
    from headprune.tasks import registry
    from headprune.tasks.unit_task import in_unit

    run_dir = tmp_path / "prune"
    payload = run(capsys, monkeypatch, tmp_path, run_dir, *RUNS[family])
    (point,) = recovered_points(payload)
    folder = run_dir / point["model_dir"]
    assert (folder / "recipe.json").is_file() and (folder / "headprune_pruning.json").is_file()
    recipe = json.loads((folder / "recipe.json").read_text())
    assert recipe["recovery"] == "finetune" and recipe["point"].endswith("@50%")
    if family == "bert":  # the point without recovery keeps no model under the default prune.save=recovered
        assert not any("model_dir" in p for p in payload["results"]["points"] if p.get("recovery") == "none")

    # loading it gives the score its table row shows, on the same split
    base = RUNS[family][: len(NLI) if family == "bert" else len(LM)]
    cfg = compose_cfg(tmp_path / "load", ["experiment=ablate", *base, "device=cpu", "logger=none"])
    cfg.paths.data_dir = str(tmp_path / "data")
    task = in_unit(registry.load_task(cfg), "head")
    model = load_pruned(folder)
    from headprune.core.attention.gates import HeadGates
    from headprune.measures.evaluation import swapped_model

    with swapped_model(task, model, HeadGates(model)):
        score = task.evaluate(None, split="eval").score
    assert score == pytest.approx(point["score"], rel=1e-6)

    # a rerun with the same settings reuses the saved model (no second fine-tune), same scores
    written = (folder / "recipe.json").stat().st_mtime_ns
    again = run(capsys, monkeypatch, tmp_path, run_dir, *RUNS[family])
    assert recovered_points(again)[0]["score"] == pytest.approx(point["score"], rel=1e-6)
    assert recovered_points(again)[0]["model_dir"] == point["model_dir"]
    assert (folder / "recipe.json").stat().st_mtime_ns == written  # reused, not fine-tuned and written again

    # export.point ships exactly that model, checked against it (not the base under the mask)
    fmt = "onnx" if family == "bert" else "hf"
    name = recipe["point"]
    out = tmp_path / "export"
    status, err = cli_run(
        capsys,
        monkeypatch,
        tmp_path,
        out,
        *base,
        *FAST,
        "experiment=export",
        f"export.format={fmt}",
        f"export.mask_file={run_dir / 'results.json'}",
        f"export.point={name}",
        "export.examples=8",
        "export.batch_size=4",
        *(["prune.unit=kv_group"] if family == "llama" else []),
    )
    assert status == 0, err
    exported = json.loads((out / "results.json").read_text())
    assert exported["inputs"]["point"] == name and Path(exported["inputs"]["model"]) == folder
    assert exported["results"]["check"]["passed"]


def test_unknown_point_lists_the_run_points(capsys, monkeypatch, tmp_path):
    run_dir = tmp_path / "prune"
    run(capsys, monkeypatch, tmp_path, run_dir, *RUNS["bert"])
    status, err = cli_run(
        capsys,
        monkeypatch,
        tmp_path,
        tmp_path / "export",
        *NLI,
        *FAST,
        "experiment=export",
        f"export.mask_file={run_dir / 'results.json'}",
        "export.point=fisher+lsq@90%",
    )
    assert status == 2 and "importance+finetune@50%" in err and "importance@50%" in err, err


def test_prune_save_none_keeps_no_model(capsys, monkeypatch, tmp_path):
    run_dir = tmp_path / "prune"
    payload = run(capsys, monkeypatch, tmp_path, run_dir, *RUNS["bert"], "prune.save=none")
    assert not (run_dir / "models").exists()
    assert not any("model_dir" in p for p in payload["results"]["points"])


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        (["prune.recover=finetune", "prune.save=some"], "choose one of recovered, all, none"),
        (["prune.recover=finetune", "prune.save=[a@50%,a@50%]"], "more than once"),
        (["prune.recover=finetune", "prune.save=[fisher]"], "method@step"),
        (["prune.save=all"], "a plain pruning curve keeps none"),
        (["export.point=x@50%"], None),
    ],
)
def test_prune_save_bad_inputs(tmp_path, overrides, fragment):
    from headprune.core.checks import ConfigError
    from headprune.validation import validate

    if fragment is None:  # export.point without a mask file
        cfg = compose_cfg(tmp_path, ["experiment=export", *NLI, "export.model=somewhere", *overrides])
        fragment = "give export.mask_file"
    else:
        cfg = compose_cfg(tmp_path, ["experiment=prune", *NLI, *overrides])
    with pytest.raises(ConfigError, match=fragment):
        validate(cfg)


def test_control_is_kept_and_speed_point_times_the_recovered_model(capsys, monkeypatch, tmp_path):
    """The control's model is kept beside the points; speed.point times a point's recovered model, checked to score its row."""
    run_dir = tmp_path / "prune"
    payload = run(capsys, monkeypatch, tmp_path, run_dir, *RUNS["bert"], "prune.control=true")
    (control,) = [p for p in payload["results"]["points"] if p.get("control")]
    folder = run_dir / control["model_dir"]
    assert json.loads((folder / "recipe.json").read_text())["point"] == "control@0%"
    written = (folder / "recipe.json").stat().st_mtime_ns
    again = run(capsys, monkeypatch, tmp_path, run_dir, *RUNS["bert"], "prune.control=true")
    (control_again,) = [p for p in again["results"]["points"] if p.get("control")]
    assert control_again["score"] == pytest.approx(control["score"], rel=1e-6)
    assert (folder / "recipe.json").stat().st_mtime_ns == written  # reused, not fine-tuned again

    results = run_dir / "results.json"
    exported = tmp_path / "export"
    status, err = cli_run(
        capsys, monkeypatch, tmp_path, exported, *NLI, *FAST, "experiment=export", f"export.mask_file={results}",
        "export.point=control@0%", "export.examples=8", "export.batch_size=4",
    )  # fmt: skip
    assert status == 0, err
    payload = json.loads((exported / "results.json").read_text())
    assert Path(payload["inputs"]["model"]) == folder and payload["results"]["check"]["passed"]

    timing = ["speed.batch_sizes=[4]", "speed.examples=8", "speed.warmup=0", "speed.repeats=2", "speed.max_repeats=2"]
    timed = tmp_path / "speed"
    name = recovered_points(again)[0]
    status, err = cli_run(
        capsys, monkeypatch, tmp_path, timed, *NLI, *FAST, *timing, "experiment=speed", f"speed.mask_file={results}",
        f"speed.point=importance+finetune@{name['step']}",
    )  # fmt: skip
    assert status == 0, err
    speed = json.loads((timed / "results.json").read_text())
    assert Path(speed["inputs"]["model"]) == run_dir / name["model_dir"]
    check = speed["results"]["score_check"]
    assert check["agree"] and check["loaded"] == pytest.approx(name["score"], rel=1e-6)
    assert speed["results"]["rows"] and speed["results"]["units_removed"] == name["units_removed"]
    status, err = cli_run(
        capsys, monkeypatch, tmp_path, tmp_path / "other_data", *NLI, *FAST, *timing, "experiment=speed", f"speed.mask_file={results}",
        f"speed.point=importance+finetune@{name['step']}", "data.synthetic.eval_size=40",
    )  # fmt: skip
    assert status != 0 and "split is not the prune run's: data.synthetic.eval_size=40 (the prune run's: 60)" in err, (
        err
    )  # a split of other examples is named

    for overrides, fragment in [
        (["speed.point=control@0%"], "is the control"),
        (["speed.point=importance+finetune@50%", "speed.mask_step=50%"], "names the point itself"),
        (["speed.point=fisher@10%"], "importance+finetune@50%"),
        (["speed.point=fisher@10%"], "speed.point=fisher@10%: speed.mask_file="),
    ]:
        status, err = cli_run(
            capsys, monkeypatch, tmp_path, tmp_path / "bad", *NLI, *FAST, "experiment=speed", f"speed.mask_file={results}", *overrides
        )
        assert status == 2 and fragment in err, (overrides, err)

    # the deployer's numbers of the saved models: ONNX f32 scores as PyTorch does; every model and runtime is timed
    numbers = tmp_path / "numbers.json"
    tool = Path(__file__).resolve().parents[1] / "tools" / "onnx_numbers.py"
    command = [sys.executable, str(tool), "--task-model", "tiny_bert", "--data", "nli_synthetic", "--batch-sizes", "1", "4"]
    command += ["--examples", "8", "--repeats", "2", "--model", f"control={folder}", "--model", f"point={run_dir / name['model_dir']}"]
    done = subprocess.run([*command, "--out", str(numbers)], capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(numbers.read_text())
    for model in result["models"].values():
        accuracy = model["accuracy"]
        assert accuracy["onnx f32"]["4"] == pytest.approx(accuracy["torch"], abs=100 / model["eval_examples"] + 1e-9)
    assert result["models"]["point"]["heads"] == result["models"]["control"]["heads"] - name["units_removed"]
    assert result["models"]["point"]["neurons"] == result["models"]["control"]["neurons"] > 0  # heads pruned, FFN whole
    assert set(result["throughput"]["4"]) == {f"{m} {r}" for m in ("control", "point") for r in ("torch", "onnx f32", "onnx int8")}
