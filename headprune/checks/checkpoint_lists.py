"""The checkpoints a dynamics run reads, checked together before the first is analysed: a listed model series or a run's epoch archives."""

import re
import zipfile
from pathlib import Path

from headprune.checks.shared_checks import check_model_type
from headprune.core.checks import ConfigError
from headprune.core.families import FAMILIES
from headprune.models.sources import check_model_dir, check_weights_readable, resolve_pretrained
from headprune.results.readers import read_json_file
from headprune.tasks.registry import check_model_dir_kind

EPOCH_FILE = re.compile(r"epoch(\d+)-step(\d+)\.ckpt$")
STEP_IN_NAME = re.compile(r"(?:step|checkpoint)[-_]?(\d+)", re.IGNORECASE)  # Pythia's step1000, HF's checkpoint-500
LAYOUT_FIELDS = (  # config.json fields that fix the attention layout: a checkpoint series shares them
    "model_type",
    "architectures",
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "hidden_size",
    "d_model",
    "n_embd",
    "num_key_value_heads",
    *dict.fromkeys(key for family in FAMILIES for key in family.config_head_counts),
)


def named_step(entry: str) -> int | None:
    """The training step a checkpoint's name tells (``...@step1000``, ``checkpoint-500``), or None."""
    found = STEP_IN_NAME.findall(str(entry).rstrip("/").rsplit("/", 1)[-1].rsplit("@", 1)[-1])
    return int(found[-1]) if found else None


def ordered_checkpoints(listed: list[str]) -> list[tuple[int, str]]:
    """(step, entry) of each checkpoint: by the distinct steps all names tell, or by position when none tells one; else a ConfigError."""
    steps = [named_step(entry) for entry in listed]
    if all(step is None for step in steps):
        return list(enumerate(listed))
    unnamed = [entry for entry, step in zip(listed, steps) if step is None]
    if unnamed:
        raise ConfigError(
            f"checkpoints: {unnamed} name no step (as step1000 or checkpoint-500) while the others do, so their place in "
            "the series is unknown: name every checkpoint's step, or none (then the list order is the training order)"
        )
    for step in dict.fromkeys(steps):
        same = [entry for entry, s in zip(listed, steps) if s == step]
        if len(same) > 1:
            raise ConfigError(f"checkpoints: {same} all tell step {step}: a series has one checkpoint per step; keep one of them")
    return sorted(zip(steps, listed))


def layout(fields: dict) -> dict:
    """The fields of a config.json that a series of checkpoints of one model shares."""
    return {key: fields[key] for key in LAYOUT_FIELDS if key in fields}


def check_checkpoint_models(cfg, listed: list[str]) -> None:
    """Every listed checkpoint present, complete, readable, a supported model of the task's kind, all one architecture and head layout."""
    first = None
    for entry in listed:
        source = Path(resolve_pretrained(entry, "checkpoints"))
        check_model_dir(source, "checkpoints", tokenizer=False)
        if not source.is_dir():
            continue  # a hub name@revision: read when it is analysed
        fields = read_json_file(source / "config.json")
        check_model_type(fields, str(source / "config.json"))
        check_weights_readable(source, "checkpoints")
        if first is not None and layout(fields) != first[1]:
            ours, theirs = layout(fields), first[1]
            keys = [key for key in dict.fromkeys([*ours, *theirs]) if ours.get(key) != theirs.get(key)]
            raise ConfigError(
                f"checkpoints: {entry} ({', '.join(f'{k}={ours.get(k)}' for k in keys)}) is not the same model as {first[0]} "
                f"({', '.join(f'{k}={theirs.get(k)}' for k in keys)}): a series holds one model at several training steps; "
                "list the checkpoints of one run"
            )
        check_model_dir_kind(fields, cfg, f"checkpoints entry {entry}")
        first = first or (entry, layout(fields))


def epoch_checkpoints(ckpt_dir: Path) -> list[tuple[int, int, Path]]:
    """(epoch, step, path) of every per-epoch checkpoint in a directory, oldest first."""
    found = [(int(m.group(1)), int(m.group(2)), path) for path in ckpt_dir.glob("*.ckpt") if (m := EPOCH_FILE.search(path.name))]
    if not found:
        raise FileNotFoundError(f"no per-epoch checkpoints (epochNNN-stepN.ckpt) in {ckpt_dir}")
    return sorted(found)


def check_epoch_checkpoints(ckpt_dir: Path) -> None:
    """A training run's checkpoints folder: its run's saved config beside it, and every per-epoch checkpoint a whole archive."""
    try:
        checkpoints = epoch_checkpoints(ckpt_dir)
    except FileNotFoundError as err:
        raise ConfigError(f"ckpt_dir={ckpt_dir}: {err}: give a training run's checkpoints folder") from None
    saved = ckpt_dir.parent / ".hydra" / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"ckpt_dir={ckpt_dir}: {saved} is missing: ckpt_dir must be <training run>/checkpoints of a headprune run")
    for _, _, path in checkpoints:
        if not zipfile.is_zipfile(path):
            raise ConfigError(
                f"ckpt_dir={ckpt_dir}: {path.name} is no readable checkpoint (damaged or truncated): restore it from a copy, "
                "or move it out of the folder to analyse the series without that epoch"
            )
