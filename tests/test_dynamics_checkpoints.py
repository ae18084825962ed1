"""Training dynamics over a pretraining run's published checkpoints: local model directories or hub name@revision."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from experiment_helpers import LM, ROOT, compose_cfg, make_cfg

from headprune.core.checks import ConfigError


@pytest.fixture(scope="module")
def checkpoint_dirs(tmp_path_factory):
    """Three checkpoints of one tiny Llama (the later ones moved further from the first), each with its tokenizer."""
    from headprune.tasks import registry

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("pretraining")
    task = registry.load_task(make_cfg(root / "build", "ablate", "lm"))
    dirs = []
    for step in (0, 1000, 2000):
        with torch.no_grad():
            for param in task.model.parameters():
                param.add_(0.05 * torch.randn_like(param) * (step > 0))
        out = root / f"step{step}"
        task.model.save_pretrained(out)
        task.tokenizer.save_pretrained(out)
        dirs.append(out)
    return dirs


def dynamics_cfg(tmp_path, *overrides):
    """experiment=dynamics on the tiny LM task."""
    return compose_cfg(tmp_path, ["experiment=dynamics", *LM, "logger=none", *overrides])


def test_dynamics_over_checkpoint_directories_draws_curves(checkpoint_dirs, tmp_path):
    out = tmp_path / "run"
    listed = ",".join(str(d) for d in checkpoint_dirs)
    env = dict(os.environ, WANDB_MODE="offline", HF_HUB_OFFLINE="1", WANDB_SILENT="true")
    overrides = ["experiment=dynamics", *LM, "logger=none", f"checkpoints=[{listed}]", f"hydra.run.dir={out}"]
    result = subprocess.run(
        [sys.executable, "-m", "headprune.cli", *overrides], cwd=ROOT, env=env, capture_output=True, text=True, timeout=400
    )
    assert result.returncode == 0, result.stderr[-3000:]
    payload = json.loads((out / "dynamics.json").read_text())
    snaps = payload["snapshots"]
    assert [s["step"] for s in snaps] == [0, 1000, 2000]
    assert [s["label"] for s in snaps] == ["step 0", "step 1000", "step 2000"]
    assert snaps[0]["metric"] == "perplexity" and snaps[0]["rank_stability"] is None
    assert all(-1.0 <= s["rank_stability"] <= 1.0 for s in snaps[1:])
    assert snaps[0]["unpruned"] != pytest.approx(snaps[2]["unpruned"], rel=1e-3)  # the checkpoints differ
    assert (out / "dynamics_pruning_curves.png").stat().st_size > 10_000
    assert (out / "dynamics_importance.png").stat().st_size > 10_000
    assert "step 2000: unpruned" in result.stdout


def test_snapshot_of_a_checkpoint_equals_loading_it_as_the_model(checkpoint_dirs, tmp_path):
    """The dynamics snapshot of a directory equals take_snapshot on the same model loaded through model.pretrained."""
    from headprune.experiments.dynamics import analyse_models
    from headprune.lightning.callbacks import take_snapshot
    from headprune.tasks import registry

    cfg = dynamics_cfg(tmp_path, f"checkpoints=[{checkpoint_dirs[1]}]")
    ours = analyse_models(cfg)[0]
    direct = make_cfg(tmp_path, "ablate", "lm", f"model.pretrained={checkpoint_dirs[1]}", f"model.tokenizer={checkpoint_dirs[1]}")
    task = registry.load_task(direct)
    theirs = take_snapshot(task, cfg.dynamics)
    scale = max(abs(s) for s in theirs["scores"])
    assert ours["scores"] == pytest.approx(theirs["scores"], abs=1e-5 * scale)


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ([], "give one"),
        (["ckpt_dir=somewhere", "checkpoints=[a,b]"], "both were given"),
        (["checkpoints=[{d},{d}]"], "more than once"),
        (["checkpoints=[{d}]", "dynamics_overrides=['task.decode_tokens=2']"], "drop dynamics_overrides"),
        (["checkpoints=[./no/such/dir]"], "not found"),
        (["checkpoints=[org/name@]"], "org/name@revision"),
    ],
)
def test_dynamics_bad_inputs(checkpoint_dirs, tmp_path, overrides, fragment):
    from headprune.validation import validate

    overrides = [o.replace("{d}", str(checkpoint_dirs[0])) for o in overrides]
    cfg = dynamics_cfg(tmp_path, *overrides)
    with pytest.raises((ConfigError, FileNotFoundError), match=fragment):
        validate(cfg)


def test_checkpoint_step_from_names():
    from headprune.checks.checkpoint_lists import named_step

    assert named_step("EleutherAI/pythia-70m@step143000") == 143000
    assert named_step("runs/out/checkpoint-500/") == 500
    assert named_step("allenai/OLMo-2-0425-1B@stage1-step10000-tokens21B") == 10000
    assert named_step("my_models/final") is None


def test_checkpoints_are_analysed_by_the_step_in_their_names(checkpoint_dirs, tmp_path, capsys):
    """Listed newest first, the checkpoints are analysed oldest first (a line says so), as the same list given in order."""
    from headprune.experiments.dynamics import analyse_models

    early, late = checkpoint_dirs[0], checkpoint_dirs[2]
    given = analyse_models(dynamics_cfg(tmp_path, f"checkpoints=[{late},{early}]", "dynamics.fractions=[0.0,0.5]"))
    assert "checkpoints taken by the step in their names: step 0" in capsys.readouterr().out
    ordered = analyse_models(dynamics_cfg(tmp_path, f"checkpoints=[{early},{late}]", "dynamics.fractions=[0.0,0.5]"))
    assert [s["step"] for s in given] == [0, 2000] and [s["checkpoint"] for s in given] == [str(early), str(late)]
    for a, b in zip(given, ordered):
        scale = max(abs(x) for x in b["scores"])
        assert a["scores"] == pytest.approx(b["scores"], abs=1e-5 * scale)


def test_ordered_checkpoints():
    from headprune.checks.checkpoint_lists import ordered_checkpoints

    assert ordered_checkpoints(["run/step200", "org/m@step100"]) == [(100, "org/m@step100"), (200, "run/step200")]
    assert ordered_checkpoints(["late", "early"]) == [(0, "late"), (1, "early")]  # no steps: the order given
    with pytest.raises(ConfigError, match="name no step"):
        ordered_checkpoints(["run/step200", "run/final"])
    with pytest.raises(ConfigError, match="all tell step 5"):
        ordered_checkpoints(["a/step5", "b/checkpoint-5"])


def test_every_checkpoint_is_checked_before_the_first_is_analysed(checkpoint_dirs, tmp_path, monkeypatch):
    """A damaged third checkpoint is refused by validation: nothing is loaded."""
    import shutil

    from headprune.tasks import registry
    from headprune.validation import validate

    broken = tmp_path / "step3000"
    shutil.copytree(checkpoint_dirs[2], broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    monkeypatch.setattr(registry, "load_task", lambda cfg: pytest.fail("a checkpoint was loaded before the check"))
    listed = ",".join(str(d) for d in [*checkpoint_dirs[:2], broken])
    with pytest.raises(ConfigError, match="step3000/model.safetensors cannot be read"):
        validate(dynamics_cfg(tmp_path, f"checkpoints=[{listed}]"))
