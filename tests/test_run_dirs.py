"""No run destroys another: real runs of tiny models through the command line, in one run directory."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from cli_runs import headprune as cli_run
from experiment_helpers import NLI

FAST = ["logger=none"]
RUN = ["device=cpu", "prune.step=0.5"]  # the experiments on a loaded task (not the fine-tune)
EXPORT = ["export.format=onnx", "export.examples=4", "export.batch_size=4", "export.fraction=0.5"]


def headprune(capsys, monkeypatch, tmp_path, run_dir: Path, *overrides: str) -> tuple[int, str]:
    """The tiny NLI run ``headprune overrides...`` into ``run_dir``: (exit status, stderr)."""
    training = any(o.startswith("experiment=nli_finetune") for o in overrides)
    return cli_run(capsys, monkeypatch, tmp_path, run_dir, *NLI, *FAST, *([] if training else RUN), *overrides)


def digest(path: Path) -> dict[str, str]:
    """SHA-256 of every file under ``path``."""
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(path.rglob("*")) if p.is_file()}


@pytest.fixture
def prune_run(capsys, monkeypatch, tmp_path):
    """A finished prune run's directory."""
    run_dir = tmp_path / "prune"
    status, err = headprune(capsys, monkeypatch, tmp_path, run_dir, "experiment=prune")
    assert status == 0, err
    return run_dir


def test_another_experiment_is_refused_in_a_finished_run_dir(prune_run, capsys, monkeypatch, tmp_path):
    before = digest(prune_run)
    mask = f"{prune_run / 'results.json'}"
    for experiment in (["experiment=speed", f"speed.mask_file={mask}"], ["experiment=export", *EXPORT, f"export.mask_file={mask}"]):
        status, err = headprune(capsys, monkeypatch, tmp_path, prune_run, *experiment)
        assert status == 2, err
        assert "finished run of experiment=prune" in err and experiment[0] in err, err
        assert "overwrite=true" in err and "hydra.run.dir" in err, err
        assert digest(prune_run) == before  # results.json, prune.png and .hydra/ untouched


def test_same_settings_resume_other_settings_are_refused_or_replaced(prune_run, capsys, monkeypatch, tmp_path):
    status, err = headprune(capsys, monkeypatch, tmp_path, prune_run, "experiment=prune")
    assert status == 0, err
    before = digest(prune_run)
    status, err = headprune(capsys, monkeypatch, tmp_path, prune_run, "experiment=prune", "prune.order=random")
    assert status == 2 and "prune.order: 'importance' there, 'random' here" in err, err
    assert digest(prune_run) == before
    status, err = headprune(capsys, monkeypatch, tmp_path, prune_run, "experiment=prune", "prune.order=random", "overwrite=true")
    assert status == 0, err
    payload = json.loads((prune_run / "results.json").read_text())
    assert list(payload["results"]["orders"]) == ["random"]
    assert "prune.order=random" in (prune_run / ".hydra" / "overrides.yaml").read_text()  # .hydra/ describes these results
    assert not (prune_run / ".hydra.next").exists()


def test_a_replacing_run_that_fails_leaves_the_old_run_and_its_settings(prune_run, capsys, monkeypatch, tmp_path):
    from headprune.experiments import prune

    before = digest(prune_run)

    def killed(cfg):
        raise RuntimeError("killed mid-way")

    monkeypatch.setattr(prune, "run", killed)
    status, err = headprune(capsys, monkeypatch, tmp_path, prune_run, "experiment=prune", "prune.order=random", "overwrite=true")
    assert status == 1 and "killed mid-way" in err, err
    assert digest(prune_run) == before  # results.json and the .hydra/ that describes it


def test_an_export_killed_mid_way_leaves_the_old_export_intact(prune_run, capsys, monkeypatch, tmp_path):
    from headprune.experiments import export

    export_dir = tmp_path / "export"
    mask = f"export.mask_file={prune_run / 'results.json'}"
    status, err = headprune(capsys, monkeypatch, tmp_path, export_dir, "experiment=export", *EXPORT, mask, "export.quantize=int8")
    assert status == 0, err
    before = digest(export_dir)
    assert any(name.startswith("export/onnx/int8/") for name in before)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # after the graph is written, during its check

    with monkeypatch.context() as patch:
        patch.setattr(export, "check_export", killed)
        with pytest.raises(KeyboardInterrupt):
            headprune(capsys, monkeypatch, tmp_path, export_dir, "experiment=export", *EXPORT, mask, "overwrite=true")
    assert {k: v for k, v in digest(export_dir).items() if not k.startswith(".export.next/")} == before
    status, err = headprune(capsys, monkeypatch, tmp_path, export_dir, "experiment=export", *EXPORT, mask, "overwrite=true")
    assert status == 0, err
    files = json.loads((export_dir / "results.json").read_text())["results"]["files"]
    on_disk = sorted(str(p.relative_to(export_dir)) for p in (export_dir / "export").rglob("*") if p.is_file())
    assert set(files) <= set(on_disk) and "export/onnx/model.onnx" in files
    assert not [name for name in on_disk if "int8" in name]  # the old int8 graphs went with the old export
    assert not (export_dir / ".export.next").exists()


def test_a_finetune_rerun_with_other_settings_is_refused(capsys, monkeypatch, tmp_path):
    run_dir = tmp_path / "train"
    train = ["experiment=nli_finetune", "trainer.enable_progress_bar=false", "data.synthetic.train_size=96", "data.importance_size=16"]
    status, err = headprune(capsys, monkeypatch, tmp_path, run_dir, *train, "trainer.max_epochs=1")
    assert status == 0, err
    before = digest(run_dir)
    status, err = headprune(capsys, monkeypatch, tmp_path, run_dir, *train, "trainer.max_epochs=2")
    assert status == 2 and "experiment=nli_finetune with other settings" in err and "trainer.max_epochs: 1 there, 2 here" in err, err
    assert digest(run_dir) == before  # results.json, model/ and checkpoints/ untouched


def finished(run_dir: Path, settings: dict) -> None:
    """A directory holding a finished run of ``settings`` (its results.json and .hydra/config.yaml)."""
    from omegaconf import OmegaConf

    from headprune.results.run_claim import write_run_record

    write_run_record(run_dir, {"config.yaml": OmegaConf.to_yaml(OmegaConf.create(settings))}, replacing=False)
    (run_dir / "results.json").write_text(json.dumps({"experiment": "train", "config": settings, "results": {}}))


def test_a_resumed_training_may_train_longer_and_a_study_reuses_its_stages(tmp_path):
    from headprune.core.checks import ConfigError
    from headprune.results.run_claim import claim_run_dir

    train = {"run": "headprune.tasks.nli.task.finetune", "trainer": {"max_epochs": 1}, "ckpt_path": None, "logger": {"a": 1}}
    finished(tmp_path, train)
    longer = {**train, "trainer": {"max_epochs": 3}, "logger": {"a": 2}}
    with pytest.raises(ConfigError, match="trainer.max_epochs: 1 there, 3 here"):
        claim_run_dir(tmp_path, "nli_finetune", longer, overwrite=False)
    assert claim_run_dir(tmp_path, "nli_finetune", {**longer, "ckpt_path": "last"}, overwrite=False) is False  # a resume
    assert claim_run_dir(tmp_path, "nli_finetune", {**train, "logger": {"a": 2}}, overwrite=False) is False  # logs elsewhere
    assert claim_run_dir(tmp_path, "nli_finetune", longer, overwrite=True) is True  # replaces it once its results land
    study = {"run": "headprune.experiments.study.run", "prune": {"step": 0.1}}
    finished(tmp_path / "study", study)
    changed = {**study, "prune": {"step": 0.2}}
    assert claim_run_dir(tmp_path / "study", "study", changed, overwrite=False, reuses_stages=True) is False
