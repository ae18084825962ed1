"""A resumable study's stages: each saved with the settings it depends on, reused only when they match."""

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from omegaconf import OmegaConf

from headprune.results.run_claim import flat
from headprune.results.writer import SCHEMA_VERSION, write_json_atomic

SHOWN_CHANGES = 3  # settings named in a "changed" line; the rest are counted
SHOWN_VALUE = 40  # longer values are not printed, only named
DISPLAY_ONLY = ("trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.log_every_n_steps")
# config sections the training stage does not read
NOT_TRAINING = frozenset("paths logger hydra run experiment_name study prune speed importance ablate keep_one dynamics".split())


def plain(value):
    """``value`` as plain JSON data (configs resolved, tensors and arrays as lists, other objects as text)."""

    def default(o):
        if OmegaConf.is_config(o):
            return OmegaConf.to_container(o, resolve=True)
        return o.tolist() if hasattr(o, "tolist") else str(o)

    return json.loads(json.dumps(value, default=default))


def digest(value) -> str:
    """A short hash of ``value``'s canonical JSON: equal for equal settings or results."""
    return hashlib.sha256(json.dumps(plain(value), sort_keys=True).encode()).hexdigest()[:16]


def changed_settings(old, new) -> str:
    """The settings that differ between two keys, e.g. ``importance.reduce: "example" -> "token"``."""
    before, after = flat(old if isinstance(old, dict) else {"key": old}, empty_dicts=False), flat(new, empty_dicts=False)
    missing = object()
    names = list(dict.fromkeys([*after, *before]))  # the key's own order: settings, then fingerprints, then inputs
    changed = [k for k in names if before.get(k, missing) != after.get(k, missing)]
    shown = [describe_change(k, before.get(k), after.get(k)) for k in changed[:SHOWN_CHANGES]]
    more = len(changed) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def describe_change(dotted: str, old, new) -> str:
    """``name: old -> new``, or ``... changed`` for a fingerprint, an earlier stage's digest or a long value (a mask)."""
    name = dotted.removeprefix("settings.")
    if name.startswith("inputs."):  # a digest of an earlier stage's results: its value says nothing
        return f"input {name.removeprefix('inputs.')} changed"
    if name.startswith("fingerprints."):  # the weights or the data the stage ran on
        return f"{name.removeprefix('fingerprints.')} fingerprint changed"
    old, new = json.dumps(old), json.dumps(new)
    return f"{name}: {old} -> {new}" if max(len(old), len(new)) <= SHOWN_VALUE else f"{name} changed"


def training_settings(training_cfg) -> dict:
    """What a trained model depends on: the training config (overrides applied) minus outputs, logging and later stages."""
    settings = {k: plain(training_cfg[k]) for k in training_cfg if k not in NOT_TRAINING}  # excluded ones never resolved
    for dotted in DISPLAY_ONLY:
        section, _, name = dotted.partition(".")
        (settings.get(section) or {}).pop(name, None)
    return settings


def saved_results(path: Path, name: str, key) -> dict | None:
    """The saved results when ``path`` is complete with the same key; else None, saying in one line why it is recomputed."""
    if not path.exists():
        return None
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        why = f"{path} is not valid JSON ({err}; an interrupted write?)"
    else:
        if not isinstance(saved, dict) or not saved.get("complete") or "results" not in saved:
            why = f"{path} holds no complete results"
        elif saved.get("schema_version") != SCHEMA_VERSION:
            why = f"{path.name} has schema version {saved.get('schema_version')}, not {SCHEMA_VERSION}"
        elif saved.get("key") != key:
            why = f"changed since {path.name} ({changed_settings(saved.get('key'), key)})"
        else:
            print(f"[study] {name}: complete in {path} with the same settings, skipped", flush=True)
            return saved["results"]
    print(f"[study] {name}: {why}: recomputing", flush=True)
    return None


def stage(out: Path, name: str, key, compute: Callable[[], dict]) -> dict:
    """Reuse ``stages/<name>.json`` when complete with the same key, else compute it and write it atomically."""
    path = out / "stages" / f"{name}.json"
    key = plain(key)
    numbers = saved_results(path, name, key)
    if numbers is None:
        numbers = plain(compute())
        write_json_atomic(
            path,
            {"schema_version": SCHEMA_VERSION, "stage": name, "fingerprint": digest(key), "key": key, "complete": True, "results": numbers},
        )
    return numbers
