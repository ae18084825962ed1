"""One run per directory: a finished run of another experiment, or of other settings, is refused before work."""

import shutil
from pathlib import Path

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError
from headprune.results.writer import read_json, replace_dir

RECORD = ".hydra"  # the settings of the run whose results.json lies beside it
NEXT_RECORD = ".hydra.next"  # the settings of a run replacing another, until its results.json is written
NOT_COMPARED = ("paths", "logger", "ckpt_path", "overwrite")  # where a run writes and logs, how it resumes: not what it computes
RESUMED_TRAINING = ("trainer", "callbacks")  # a training resumed from its checkpoint (ckpt_path) may train longer
SHOWN_DIFFERENCES = 6


def flat(settings, prefix: str = "", empty_dicts: bool = True) -> dict:
    """A nested config as {dotted key: value} (lists are values; so are empty dicts, unless ``empty_dicts`` is False: then dropped)."""
    if not isinstance(settings, dict):
        return {prefix: settings}
    out = {}
    for key, value in settings.items():
        nested = isinstance(value, dict) and (bool(value) or not empty_dicts)
        out.update(flat(value, f"{prefix}{key}.", empty_dicts) if nested else {f"{prefix}{key}": value})
    return out


def compared(settings: dict, resumed: bool) -> dict:
    """The dotted settings that decide what a run computes."""
    skip = NOT_COMPARED + (RESUMED_TRAINING if resumed else ())
    return {k: v for k, v in flat(settings).items() if k.split(".")[0] not in skip}


def differences(there: dict, here: dict, resumed: bool) -> list[str]:
    """``key: A there, B here`` for every compared setting that differs."""
    old, new = compared(there, resumed), compared(here, resumed)
    return [
        f"{key}: {old.get(key, '(unset)')!r} there, {new.get(key, '(unset)')!r} here"
        for key in sorted(old.keys() | new.keys())
        if old.get(key) != new.get(key)
    ]


def recorded_settings(out: Path, paths: dict) -> dict | None:
    """The settings of the run recorded in ``out/.hydra/config.yaml`` (resolved with this run's ``paths``), or None."""
    saved = out / RECORD / "config.yaml"
    if not saved.is_file():
        return None
    loaded = OmegaConf.load(saved)
    OmegaConf.set_struct(loaded, False)
    loaded.paths = paths
    try:
        return OmegaConf.to_container(loaded, resolve=True)
    except Exception:  # an interpolation this process cannot resolve: compare the settings as written
        return OmegaConf.to_container(loaded, resolve=False)


def recorded_experiment(out: Path, payload: dict) -> str:
    """The experiment of the finished run in ``out``: its Hydra choice when recorded, else results.json's kind."""
    saved = out / RECORD / "hydra.yaml"
    if saved.is_file():
        choice = OmegaConf.select(OmegaConf.load(saved), "hydra.runtime.choices.experiment")
        if choice:
            return str(choice)
    return str(payload.get("experiment"))


def claim_run_dir(out: Path, experiment: str, settings: dict, overwrite: bool, reuses_stages: bool = False) -> bool:
    """Refuse ``out`` holding a finished run of another experiment or settings; True when ``overwrite`` replaces one, else False."""
    out = Path(out)
    results = out / "results.json"
    if not results.is_file():
        return False
    fix = f"set overwrite=true to replace it, or give a new hydra.run.dir (this run: experiment={experiment})"
    try:
        payload = read_json(results)
    except ValueError:
        if overwrite:
            return True
        raise ConfigError(f"{out} holds a damaged results.json (not valid JSON): it is no run to resume; {fix}") from None
    there = recorded_settings(out, settings.get("paths") or {}) or payload.get("config") or {}
    found = recorded_experiment(out, payload)
    if there.get("run") != settings.get("run"):
        if overwrite:
            return True
        raise ConfigError(
            f"{out} holds a finished run of experiment={found} ({results}); this run is experiment={experiment} and would "
            f"replace its results: {fix}"
        )
    if reuses_stages:  # the experiment itself reuses what is unchanged and recomputes the rest, saying what changed
        return False
    changed = differences(there, settings, resumed=bool(settings.get("ckpt_path")))
    if not changed:
        return False
    if overwrite:
        return True
    shown = "; ".join(changed[:SHOWN_DIFFERENCES]) + (
        f"; and {len(changed) - SHOWN_DIFFERENCES} more" if len(changed) > SHOWN_DIFFERENCES else ""
    )
    raise ConfigError(f"{out} holds a finished run of experiment={found} with other settings ({shown}); {fix}")


def results_stamp(out: Path) -> tuple | None:
    """What identifies the results.json now in ``out`` (an atomic write replaces it: a new inode or mtime), or None."""
    try:
        stat = (Path(out) / "results.json").stat()
    except FileNotFoundError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size


def write_run_record(out: Path, files: dict[str, str], replacing: bool) -> Path:
    """Write the run's settings (``files``: name -> text) into ``.hydra/``, or ``.hydra.next/`` while a replaced run's results remain."""
    record = Path(out) / (NEXT_RECORD if replacing else RECORD)
    if record.exists():
        shutil.rmtree(record)
    record.mkdir(parents=True)
    for name, text in files.items():
        (record / name).write_text(text, encoding="utf-8")
    return record


def settle_run_record(out: Path, stamp_before: tuple | None) -> None:
    """After a replacing run: its ``.hydra.next/`` becomes ``.hydra/`` once it wrote results.json, else it is dropped."""
    staged = Path(out) / NEXT_RECORD
    if not staged.exists():
        return
    if results_stamp(out) == stamp_before:  # the run stopped before its results: the old run stays whole
        shutil.rmtree(staged)
        return
    replace_dir(staged, Path(out) / RECORD)
