"""Every registered kind alone and every pair a joint unit allows, through every experiment: it runs, or is refused in one line.

The matrix is read from the registry (``KINDS``, ``unit_kinds``), so a kind registered tomorrow is in it. Each case runs the
command line in this process and passes when it exits 0, or exits 2 with one ``headprune: error:`` line that names one of
the case's settings, no traceback and no results written. A traceback (exit 1, or any exception) fails it.
"""

from __future__ import annotations

import logging
import sys
import traceback
from itertools import combinations
from pathlib import Path

import pytest
import torch
from experiment_helpers import BASES

from headprune import cli
from headprune.core.unit_kinds import KINDS, unit_kinds

BPE = "data.tokenizer.vocab_size=300"  # the GGUF tokenizer needs BPE merges (a vocabulary beyond single bytes)
TASKS = {"lm": [BPE if o.startswith("data.tokenizer.vocab_size=") else o for o in BASES["lm"]], "nli": BASES["nli"]}
COMMON = ["logger=none", "device=cpu"]
FRACTION = ["prune.fractions=[0.5]"]  # the prune run whose step 0.5 speed and export read (their default fraction)


def _joint_units() -> list[str]:
    """Every pair of registered kinds that ``unit_kinds`` accepts as one joint unit."""
    pairs = []
    for first, second in combinations(KINDS, 2):
        try:
            pairs.append("+".join(unit_kinds([first, second])))
        except ValueError:
            continue  # both prune the same part: refused as a unit
    return pairs


SINGLE = list(KINDS)
UNITS = SINGLE + _joint_units()


def _unit_override(unit: str) -> str:
    return f"prune.unit=[{','.join(unit.split('+'))}]" if "+" in unit else f"prune.unit={unit}"


SMALL_SPEED = ["speed.batch_sizes=[2]", "speed.examples=4", "speed.repeats=1", "speed.max_repeats=2", "speed.warmup=0"]
PRUNE_CASES = {  # experiment=prune with each way of choosing and recovering
    "fractions": FRACTION,
    "flops_target": ["prune.target={flops:0.7}"],
    "latency_target": ["prune.cost=latency", "prune.target={speedup:1.1}", "prune.seq_len=16"],
    "lsq": [*FRACTION, "prune.recover=lsq"],
    "reconstruct": [*FRACTION, "prune.recover=reconstruct"],
    "obs": [*FRACTION, "prune.order=obs_fisher"],
    "finetune": [*FRACTION, "prune.recover=finetune", "prune.finetune.max_steps=1", "prune.finetune.progress=false"],
}
EXPORT_CASES = {  # experiment=export of the fractions run's mask
    "hf": ["export.format=hf"],
    "onnx": ["export.format=onnx"],
    "onnx_int8": ["export.format=onnx", "export.quantize=int8"],
    "gguf": ["export.format=gguf", "export.tokenizer_pre=gpt-2"],  # the task's trained tokenizer: its byte-level splitting named
    "deci_hf": ["export.format=deci_hf"],
}
OTHER_CASES = {  # the experiments that score or time units without a prune run of their own
    "keep_one": ["experiment=keep_one", "keep_one.n_samples=50"],
    "ablate": ["experiment=ablate", "ablate.n_samples=50"],
    "study": [
        "experiment=study",
        "study.train=false",
        "study.n_samples=50",
        "study.extra_splits=[]",
        *FRACTION,
        "prune.order=[importance,random]",
        *SMALL_SPEED,
    ],
}
KNOWN = {}  # (task, unit, case): why it is expected to fail (recorded below where found)


def run_cli(capsys, monkeypatch, tmp_path: Path, run_dir: Path, overrides: list[str]) -> tuple[int, str]:
    """``headprune overrides...`` in this process: (exit status, stderr); an exception escaping it is status 1 and its traceback."""
    capsys.readouterr()
    argv = ["headprune", *overrides, f"hydra.run.dir={run_dir}", f"paths.data_dir={tmp_path / 'data'}"]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(logging, "raiseExceptions", False)  # a log handler of an earlier case writes to that case's closed capture
    torch.set_num_threads(1)
    try:
        cli.main()
        status = 0
    except SystemExit as done:
        status = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except Exception:  # noqa: BLE001  (a crash is a result of the case: its traceback is the message)
        return 1, capsys.readouterr().err + traceback.format_exc()
    return status, capsys.readouterr().err


def assert_runs_or_is_refused(status: int, err: str, run_dir: Path, overrides: list[str], record_property) -> None:
    """Exit 0; or exit 2 with one error line naming one of ``overrides``' settings, no traceback and no results written."""
    assert status in (0, 2) and "Traceback" not in err, f"exit {status}:\n{err[-3000:]}"
    if status == 0:
        record_property("outcome", "ran")
        return
    errors = [line for line in err.splitlines() if line.startswith("headprune: error:")]
    assert len(errors) == 1, err[-3000:]
    named = {o.split("=", 1)[0].lstrip("+") for o in overrides} | {o.split("=", 1)[1] for o in overrides if "=" in o}
    assert any(word in errors[0] for word in named if word), errors[0]
    assert not (run_dir / "results.json").exists(), f"refused after writing results: {errors[0]}"
    record_property("outcome", "refused")
    record_property("message", errors[0])


def _known(task: str, unit: str, case: str) -> None:
    reason = KNOWN.get((task, unit, case))
    if reason:
        pytest.xfail(reason)


@pytest.fixture(scope="module")
def prune_runs(tmp_path_factory):
    """The fractions prune run of each (task, unit), run once: {(task, unit): (status, err, run dir)}."""
    return {"root": tmp_path_factory.mktemp("prune_runs")}


def fractions_run(prune_runs, capsys, monkeypatch, task: str, unit: str) -> tuple[int, str, Path, list[str]]:
    """experiment=prune with fractions on the task's tiny model: (status, stderr, run dir, overrides), cached per (task, unit)."""
    root = prune_runs["root"]
    overrides = [*TASKS[task], *COMMON, "experiment=prune", _unit_override(unit), *PRUNE_CASES["fractions"]]
    if (task, unit) not in prune_runs:
        run_dir = root / f"{task}-{unit}"
        status, err = run_cli(capsys, monkeypatch, root, run_dir, overrides)
        prune_runs[(task, unit)] = (status, err, run_dir)
    return (*prune_runs[(task, unit)], overrides)


def _mask_of(prune_runs, capsys, monkeypatch, task: str, unit: str) -> Path:
    """The fractions run's results file; the case is skipped when that run was refused (its own case says so)."""
    status, err, run_dir, _ = fractions_run(prune_runs, capsys, monkeypatch, task, unit)
    if status != 0:
        said = [line for line in err.splitlines() if line.startswith("headprune: error:")] or err.strip().splitlines()[-1:]
        pytest.skip(f"experiment=prune {_unit_override(unit)} did not run: {said[0] if said else status}")
    return run_dir / "results.json"


def _prune_case(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit, case):
    _known(task, unit, case)
    if case == "fractions":
        status, err, run_dir, overrides = fractions_run(prune_runs, capsys, monkeypatch, task, unit)
    else:
        overrides = [*TASKS[task], *COMMON, "experiment=prune", _unit_override(unit), *PRUNE_CASES[case]]
        run_dir = tmp_path / "run"
        status, err = run_cli(capsys, monkeypatch, tmp_path, run_dir, overrides)
    assert_runs_or_is_refused(status, err, run_dir, overrides, record_property)


def _export_case(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit, case):
    _known(task, unit, case)
    mask = _mask_of(prune_runs, capsys, monkeypatch, task, unit)
    small = ["export.examples=4", "export.batch_size=2", "speed.batch_sizes=[2]", "export.new_tokens=2"]
    overrides = [*TASKS[task], *COMMON, "experiment=export", f"export.mask_file={mask}", *small, *EXPORT_CASES[case]]
    status, err = run_cli(capsys, monkeypatch, tmp_path, tmp_path / "run", overrides)
    assert_runs_or_is_refused(status, err, tmp_path / "run", overrides, record_property)


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("unit", SINGLE)
def test_every_kind_prunes_by_fractions(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit):
    _prune_case(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit, "fractions")


@pytest.mark.parametrize("task", list(TASKS))
@pytest.mark.parametrize("unit", SINGLE)
def test_every_kind_exports_to_onnx(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit):
    _export_case(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit, "onnx")


def _slow_cases(cases, skip=()):
    return [
        pytest.param(task, unit, case, id=f"{task}-{unit}-{case}")
        for task in TASKS
        for unit in UNITS
        for case in cases
        if (unit, case) not in skip
    ]


FAST_PRUNE = {(unit, "fractions") for unit in SINGLE}  # run by the fast tests above
FAST_EXPORT = {(unit, "onnx") for unit in SINGLE}


@pytest.mark.slow
@pytest.mark.parametrize("task,unit,case", _slow_cases(PRUNE_CASES, FAST_PRUNE))
def test_prune(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit, case):
    _prune_case(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit, case)


@pytest.mark.slow
@pytest.mark.parametrize("task,unit", [(task, unit) for task in TASKS for unit in UNITS])
def test_speed_from_the_mask_file(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit):
    _known(task, unit, "speed")
    mask = _mask_of(prune_runs, capsys, monkeypatch, task, unit)
    overrides = [*TASKS[task], *COMMON, "experiment=speed", f"speed.mask_file={mask}", *SMALL_SPEED]
    status, err = run_cli(capsys, monkeypatch, tmp_path, tmp_path / "run", overrides)
    assert_runs_or_is_refused(status, err, tmp_path / "run", overrides, record_property)


@pytest.mark.slow
@pytest.mark.parametrize("task,unit,case", _slow_cases(EXPORT_CASES, FAST_EXPORT))
def test_export(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit, case):
    _export_case(prune_runs, capsys, monkeypatch, tmp_path, record_property, task, unit, case)


@pytest.mark.slow
@pytest.mark.parametrize("task,unit,case", _slow_cases(OTHER_CASES))
def test_other_experiments(capsys, monkeypatch, tmp_path, record_property, task, unit, case):
    _known(task, unit, case)
    overrides = [*TASKS[task], *COMMON, _unit_override(unit), *OTHER_CASES[case]]
    status, err = run_cli(capsys, monkeypatch, tmp_path, tmp_path / "run", overrides)
    assert_runs_or_is_refused(status, err, tmp_path / "run", overrides, record_property)
