"""Which task a config asks for, decided in one place: ``TASKS`` maps ``model.kind`` to the task that reads it.

A new task is one ``TaskSpec`` line here plus its module (a ``load(cfg) -> Task`` and a ``train(cfg)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hydra.utils import get_method


@dataclass(frozen=True)
class TaskSpec:
    """A task: its name, the data it reads, its splits, and the dotted paths of its loader, trainer and config check."""

    name: str  # "nli", "mt", ...
    data_kind: str | None  # the ``data.kind`` its data configs carry (None: they carry none)
    data_choices: str  # the data configs to suggest in errors
    load: str  # cfg -> Task (model with gates + data)
    train: str | None  # cfg -> metrics: fine-tune / train the model and save <output_dir>/model (None: no trainer)
    splits: tuple[str, ...]  # the split names its experiments may name (prune.split, ablate.splits, ...)
    check: str  # check(cfg, files=True, importance=True): its task.* and data.* settings, data files, lengths; ConfigError
    selection: str  # the held-out split for choices when no setting names one (never the evaluation split)
    data_split: str | None = None  # (data cfg, split) -> the data split a name reads (e.g. MT eval -> test); None: itself


TASKS: dict[str, TaskSpec] = {  # keyed by model.kind
    "classifier": TaskSpec(
        "nli",
        None,
        "data=nli_synthetic|nli_local|nli_hub",
        "headprune.tasks.nli.task.load_nli_task",
        "headprune.tasks.nli.task.finetune",
        splits=("train", "importance", "eval", "eval_mismatched"),
        check="headprune.tasks.nli.config_check.check",
        selection="importance",
    ),
    "seq2seq": TaskSpec(
        "mt",
        "translation",
        "data=mt_synthetic|mt_multi30k|mt_iwslt14|mt_wmt|mt_hub",
        "headprune.tasks.mt.task.load_translation_task",
        "headprune.tasks.mt.task.train",
        splits=("train", "valid", "test", "eval", "heldout"),
        check="headprune.tasks.mt.config_check.check",
        selection="heldout",
        data_split="headprune.tasks.mt.config.split_of",
    ),
    "causal_lm": TaskSpec(
        "lm",
        "lm",
        "data=lm_local|lm_synthetic|lm_hub",
        "headprune.tasks.lm.task.load_lm_task",
        None,
        splits=("eval", "eval_other", "importance", "heldout", "train"),
        check="headprune.tasks.lm.config_check.check",
        selection="importance",
    ),
}


def task_spec(cfg) -> TaskSpec:
    """The task of ``model.kind``, checked against the chosen data config."""
    kind = cfg.model.get("kind")
    if kind not in TASKS:
        raise ValueError(f"model.kind must be one of {sorted(TASKS)}, got {kind!r}")
    spec = TASKS[kind]
    if cfg.get("data") is None:
        raise ValueError(f"no data chosen: add {spec.data_choices} for model.kind={kind}")
    if cfg.data.get("kind") != spec.data_kind:
        raise ValueError(
            f"model {cfg.model.get('name')} ({kind}) does not fit data {cfg.data.get('name')}: "
            f"the {spec.name} task reads {spec.data_choices}"
        )
    return spec


def device_of(cfg) -> torch.device:
    """``device=auto`` (default): CUDA when available, else CPU."""
    name = str(cfg.device)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def load_task(cfg):
    """The Task (model with gates + data) that the config describes, in eval mode on its device, in ``prune.unit``."""
    from headprune.tasks.unit_task import in_unit, unit_of

    task = get_method(task_spec(cfg).load)(cfg)
    task.to(device_of(cfg))
    task.model.eval()
    return in_unit(task, unit_of(cfg))


def train_task(cfg) -> dict:
    """Fine-tune / train the config's model into ``<output_dir>/model`` with its task's trainer."""
    spec = task_spec(cfg)
    if spec.train is None:
        raise ValueError(
            f"the {spec.name} task has no trainer: use a trained model (model.pretrained=...) and, in a study, study.train=false"
        )
    return get_method(spec.train)(cfg)
