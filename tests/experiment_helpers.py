"""Helpers for the experiment tests: compose the real configs shrunk to tiny models and data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import open_dict

CONF = str(Path(__file__).resolve().parents[1] / "conf")
ROOT = Path(__file__).resolve().parents[1]
NLI = [
    "model=tiny_bert",
    "data=nli_synthetic",
    "data.synthetic.train_size=240",
    "data.synthetic.eval_size=60",
    "data.synthetic.mismatched_size=40",
    "data.importance_size=40",
    "data.batch_size=16",
]
MT = [
    "model=tiny_marian",
    "data=mt_synthetic",
    "data.synthetic.sizes.train=300",
    "data.synthetic.sizes.valid=16",
    "data.synthetic.sizes.test=16",
    "data.importance.size=32",
    "data.tokenizer.vocab_size=300",
    "task.beam_size=1",
    "task.len_extra=2",
    "task.len_ratio=1.0",
]
LM = [
    "model=tiny_llama",
    "data=lm_synthetic",
    "data.synthetic.sizes.eval=24",
    "data.synthetic.sizes.importance=24",
    "data.synthetic.sizes.heldout=16",
    "data.tokenizer.vocab_size=200",
    "task.decode_tokens=4",
    "task.decode_prompt_tokens=4",
]
PASSKEY = [
    "model=tiny_llama",
    "data=passkey_synthetic",
    "data.sizes.eval=8",
    "data.sizes.importance=6",
    "data.sizes.heldout=4",
    "data.sizes.train=4",
    "task.decode_tokens=4",
    "task.decode_prompt_tokens=4",
]
VISION = ["model=tiny_vit", "data=image_digits", "data.eval_size=60", "data.importance_size=32", "data.limit_train=96"]
FAST = ["logger=none", "ablate.n_samples=200"]
BASES = {"nli": NLI, "mt": MT, "lm": LM, "vision": VISION, "passkey": PASSKEY}  # the tiny test configuration of each task


def compose_cfg(tmp_path, overrides: list[str]):
    """The real ``conf/`` config composed with ``overrides``, its outputs and data cache in ``tmp_path``."""
    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.data_dir = str(tmp_path / "data")
    return cfg


def training_cfg(tmp_path, experiment: str, model: str, small: list[str], *overrides):
    """A training experiment's config shrunk to a tiny model, small data, one epoch and no logger."""
    return compose_cfg(
        tmp_path,
        [
            f"experiment={experiment}",
            f"model={model}",
            "logger=none",
            *small,
            "trainer.max_epochs=1",
            "trainer.enable_progress_bar=false",
            "+trainer.enable_model_summary=false",
            *overrides,
        ],
    )


def make_cfg(tmp_path, experiment: str, task: str, *overrides):
    """The experiment's config for the NLI, MT or LM test task, output in ``tmp_path``."""
    base = BASES[task]
    extra = [o for o in FAST if o.split("=")[0].split(".")[0] in ("logger", experiment)]
    return compose_cfg(tmp_path, [f"experiment={experiment}", *base, "device=cpu", *extra, *overrides])


def speed_settings(**overrides):
    """The speed settings of conf/speed/default.yaml with ``overrides``."""
    from omegaconf import OmegaConf

    from headprune.settings import SpeedSettings, read_settings

    merged = OmegaConf.merge(OmegaConf.load(Path(CONF) / "speed" / "default.yaml"), overrides)
    return read_settings(SpeedSettings, merged, "speed")


def task_fixtures(task_name: str):
    """Fixtures ``task`` (the test task, loaded once per module) and ``shared_task`` (experiments reuse it)."""

    @pytest.fixture(scope="module")
    def task(tmp_path_factory):
        torch.set_num_threads(1)
        from headprune.tasks import registry

        return registry.load_task(make_cfg(tmp_path_factory.mktemp("task"), "ablate", task_name))

    @pytest.fixture
    def shared_task(task, monkeypatch):
        """The loaded task reused by every experiment, seen in the config's prune.unit as load_task would."""
        from headprune.tasks import registry
        from headprune.tasks.unit_task import in_unit, unit_of

        monkeypatch.setattr(registry, "load_task", lambda cfg: in_unit(task, unit_of(cfg)))
        return task

    return task, shared_task


def results(tmp_path) -> dict:
    payload = json.loads((Path(tmp_path) / "results.json").read_text())
    assert payload["schema_version"] >= 1 and payload["complete"] is True
    assert payload["fingerprints"]["model"] and payload["fingerprints"]["data"]
    for figure in payload["figures"]:
        assert (Path(tmp_path) / figure).stat().st_size > 1000, figure
    return payload


def built_clients() -> Path | None:
    """Where make test-clients built llama.cpp's venv: $HEADPRUNE_CLIENTS, else .clients beside the tests; None when neither holds it."""
    for folder in (os.environ.get("HEADPRUNE_CLIENTS"), ROOT / ".clients"):
        if folder and any((Path(folder) / "venv").glob(".ready-*")):
            return Path(folder)
    return None
