"""Where a model comes from: an embedded short name, a local directory or checkpoint, or the HF hub."""

import importlib
import os
from pathlib import Path

from headprune.core.checks import ConfigError
from headprune.models.embedded import EMBEDDED, EMBEDDED_LLMS, embedded_model_dir

VOCABULARY_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "source.spm",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "preprocessor_config.json",  # an image model's processor: what turns its inputs into tensors
)  # a saved tokenizer has at least one of these (a config alone is not a vocabulary)


def has_tokenizer(path: str | Path) -> bool:
    """True when ``path`` is a directory holding a saved tokenizer's vocabulary."""
    path = Path(path)
    return path.is_dir() and any((path / name).exists() for name in VOCABULARY_FILES)


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


def looks_like_path(name: str) -> bool:
    """True for a value that can only be a path, never a hub name."""
    return name.startswith((".", "/", "~", "\\")) or name.count("/") > 1 or "\\" in name or name.endswith(".ckpt")


def hub_reachable(timeout: float = 1.5) -> bool:
    """False in offline mode (HF_HUB_OFFLINE=1) or when the hub's host cannot be reached within ``timeout`` seconds."""
    import socket
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    host = urlparse(constants.ENDPOINT).hostname or "huggingface.co"
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def split_revision(name: str) -> tuple[str, str | None]:
    """A hub name and its revision from ``org/name@revision`` (Pythia's ``step1000``, a branch, a commit); else (name, None)."""
    if "@" not in name or looks_like_path(name) or Path(name).expanduser().exists():
        return name, None
    repo, _, revision = name.rpartition("@")
    if not repo or not revision:
        raise ConfigError(f"{name!r} is neither a local path nor a hub name: write org/name@revision, e.g. EleutherAI/pythia-70m@step1000")
    return repo, revision


def _in_hub_cache(name: str) -> bool:
    repo, revision = split_revision(name)
    try:
        from huggingface_hub import try_to_load_from_cache

        return any(isinstance(try_to_load_from_cache(repo, f, revision=revision), str) for f in ("config.json", "tokenizer_config.json"))
    except Exception:  # noqa: BLE001 - a malformed repo id is simply not cached
        return False


def resolve_pretrained(name: str | None, setting: str = "model.pretrained") -> str | None:
    """The directory of an embedded name or a local path (absolute), or a hub name that can be loaded now."""
    if name is None:
        return None
    name = str(name)
    if name in EMBEDDED_LLMS:
        return str(embedded_model_dir(name))  # converted once from the package's GGUF file
    if name in EMBEDDED:
        return str(Path(importlib.import_module(EMBEDDED[name]).get_model_path()))
    path = Path(name).expanduser()
    if path.is_file() and not name.endswith(".ckpt"):
        raise ConfigError(
            f"{setting}={name} is a file; a model is a directory (config.json, weights, tokenizer): set {setting}={path.resolve().parent}"
        )
    if path.exists():
        return str(path.resolve())
    if looks_like_path(name):
        raise FileNotFoundError(
            f"{setting}={name} not found: no file or directory {path.resolve()} "
            "(a trained model is <run dir>/model; a study's is <run dir>/train/model)"
        )
    if _in_hub_cache(name) or hub_reachable():
        return name
    repo, revision = split_revision(name)
    download = f"hf download {repo}" + (f" --revision {revision}" if revision else "")
    raise FileNotFoundError(
        f"{setting}={name} is no local directory ({path.resolve()} does not exist) and the Hugging Face hub "
        f"cannot be reached (offline): download it on a machine with a network (`{download} "
        f"--local-dir <dir>`) and point at the copy with {setting}=<dir>"
    )


def check_model_dir(path: str | Path, setting: str = "model.pretrained", tokenizer: bool = True) -> None:
    """A clear error unless a local model directory holds config.json, weights and (with ``tokenizer``) a tokenizer."""
    path = Path(path)
    if not path.is_dir():
        return  # a hub name or a checkpoint file
    absent = {  # what a complete directory holds: absent or not
        "config.json": not (path / "config.json").is_file(),
        f"weights (one of {', '.join(WEIGHT_FILES)})": not any((path / name).is_file() for name in WEIGHT_FILES),
        f"tokenizer files (one of {', '.join(VOCABULARY_FILES)})": tokenizer and not has_tokenizer(path),
    }
    missing = [what for what, is_absent in absent.items() if is_absent]
    if missing:
        raise FileNotFoundError(
            f"{setting}={path} is not a complete model directory: it lacks {'; '.join(missing)}. "
            "Save model and tokenizer together (model.save_pretrained(dir); tokenizer.save_pretrained(dir))"
            + (", or set model.tokenizer=<dir with the tokenizer>" if tokenizer else "")
        )


def config_fields(model_cfg) -> dict | None:
    """The model's config fields: model.config, or the local model's config.json (None: unknown, e.g. a hub name)."""
    from headprune.results.readers import read_json_file

    fields = model_cfg.get("config")
    if fields is None and model_cfg.get("pretrained") and not str(model_cfg.pretrained).endswith(".ckpt"):
        path = Path(resolve_pretrained(str(model_cfg.pretrained))) / "config.json"
        if not path.is_file():
            return None
        fields = read_json_file(path)
    return None if fields is None else dict(fields)


def max_positions(model_cfg) -> int | None:
    """The most token positions the model takes (``max_position_embeddings``; None: unknown or unbounded)."""
    fields = config_fields(model_cfg)
    value = None if fields is None else fields.get("max_position_embeddings", fields.get("n_positions"))  # n_positions: GPT-2
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def check_weights_readable(path: str | Path, setting: str = "model.pretrained") -> None:
    """A ConfigError naming the first weight file of a local model directory that is truncated or damaged (no tensor is loaded)."""
    import zipfile

    from safetensors import safe_open

    path = Path(path)
    if not path.is_dir():
        return
    for file in sorted(path.glob("*.safetensors")):
        try:
            with safe_open(str(file), "pt"):
                pass
        except Exception as err:  # noqa: BLE001 - safetensors raises its own error type for a damaged header
            raise ConfigError(
                f"{setting}: {file} cannot be read as weights ({err}): the file is damaged or truncated; copy it again"
            ) from None
    for file in sorted(path.glob("pytorch_model*.bin")):
        if not zipfile.is_zipfile(file):
            raise ConfigError(f"{setting}: {file} is no readable weight file (damaged or truncated): copy it again")
