"""Results files: atomic JSON writes and directories moved into place whole, a versioned schema, and fingerprints of inputs."""

import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

SCHEMA_VERSION = 2  # 2: units_removed / units_total / min_units_per_layer (1: heads_pruned / heads_total / total_heads)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write text to a temp file beside ``path`` and rename it over ``path``, with the mode a plain ``open`` gives."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    umask = os.umask(0)  # the process's file-creation mask, read by setting it, then put back
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600: results are read by others (collaborators, a web server)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path


def write_json_atomic(path: str | Path, payload) -> Path:
    """Write JSON atomically (see ``write_text_atomic``): never a half-written file."""
    return write_text_atomic(path, json.dumps(payload, indent=1, default=_jsonable))


def output_dir(cfg) -> Path:
    """The run directory (Hydra's output dir), created when missing."""
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


OWN_FILE_FIX = "delete it to recompute what it held"  # a file a run wrote itself (never a user's input)


def read_json(path: str | Path, fix: str = "replace it with an intact copy"):
    """Load a JSON file; a damaged one is a ValueError naming the file and ``fix`` (how to get an intact one)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not valid JSON ({err}): the file is damaged (an interrupted write or copy?); {fix}") from None


def _jsonable(value):
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"cannot write {type(value).__name__} to JSON")


def model_fingerprint(model) -> str:
    """A short hash of a model's parameter names, shapes and a sample of values."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        flat = tensor.detach().reshape(-1)
        if flat.numel():
            digest.update(flat[:: max(1, flat.numel() // 64)].float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def texts_fingerprint(texts) -> str:
    """A short hash of a sequence of strings (data fingerprint)."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(str(text).encode())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def batches_fingerprint(batches) -> str:
    """A short hash of model-input batches ({name: tensor}): the data a computation such as importance read."""
    digest = hashlib.sha256()
    for batch in batches:
        for name, value in sorted(batch.items()):
            digest.update(name.encode())
            if not hasattr(value, "detach"):
                digest.update(repr(value).encode())
                continue
            tensor = value.detach().cpu()
            digest.update(str(tuple(tensor.shape)).encode())
            digest.update((tensor.float() if tensor.is_floating_point() else tensor.long()).contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def write_results_file(
    path: str | Path, kind: str, config: dict | None, numbers: dict | None = None, fingerprints: dict | None = None, **fields
) -> Path:
    """The one writer of results files: the versioned envelope every results.json shares, plus ``fields``, written atomically."""
    payload = {
        "schema_version": SCHEMA_VERSION,
        "experiment": kind,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "fingerprints": fingerprints or {},
        "config": config or {},
        "results": numbers if numbers is not None else {},
        **fields,
    }
    return write_json_atomic(path, payload)


def update_results(path: str | Path, numbers: dict, config: dict | None = None, kind: str = "train") -> Path:
    """Merge ``numbers`` into the ``results`` of an existing results file (or write a new one), atomically."""
    path = Path(path)
    if not path.exists():
        return write_results_file(path, kind, config, numbers)
    payload = read_json(path, OWN_FILE_FIX)
    payload.setdefault("results", {}).update(numbers)
    return write_json_atomic(path, payload)


def fresh_dir(path: str | Path) -> Path:
    """An empty directory at ``path`` (what an earlier, interrupted run left there is removed)."""
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def replace_dir(staged: str | Path, final: str | Path) -> Path:
    """Move the finished ``staged`` directory to ``final``, replacing what was there (two renames, then the old one is deleted)."""
    staged, final = Path(staged), Path(final)
    old = final.with_name(f".{final.name}.old")
    if old.exists():
        shutil.rmtree(old)
    if final.exists():
        os.replace(final, old)
    os.replace(staged, final)
    shutil.rmtree(old, ignore_errors=True)
    return final
