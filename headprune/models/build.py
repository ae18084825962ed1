"""Build models and tokenizers from a model config: the embedded MiniLM, the hub, a local dir, or a fresh config."""

from contextlib import nullcontext
from pathlib import Path

import torch
from omegaconf import OmegaConf

from headprune.core.saving import RECORD_FILE
from headprune.models.sources import VOCABULARY_FILES, check_model_dir, has_tokenizer, resolve_pretrained, split_revision
from headprune.models.tokenizers import load_tokenizer


def tokenizer_source(model_cfg) -> str:
    """The resolved ``model.tokenizer`` (embedded name, hub name or a directory that holds tokenizer files)."""
    name = model_cfg.get("tokenizer")
    if not name:
        raise ValueError(f"model {model_cfg.get('name')!r} sets no tokenizer: set model.tokenizer=<dir, hub name or minilm>")
    source = resolve_pretrained(name, "model.tokenizer")
    if Path(source).is_dir() and not has_tokenizer(source):
        raise FileNotFoundError(
            f"model.tokenizer={name} ({source}) holds no tokenizer files (one of {', '.join(VOCABULARY_FILES)}): "
            "save the tokenizer the model was trained with into it, or set model.tokenizer=<dir with it>"
        )
    return source


def build_tokenizer(model_cfg):
    """The tokenizer named by ``model_cfg.tokenizer`` (embedded name, hub name or directory)."""
    return load_tokenizer(tokenizer_source(model_cfg))


def build_model(model_cfg, model_class, vocab_size: int | None = None, seed: int | None = None, **extra):
    """A ``model_class`` from ``model_cfg``: pretrained weights, else a fresh config drawn from ``seed``; ``extra`` go in its config."""
    from transformers import AutoConfig

    attn = model_cfg.attn_implementation
    with torch.random.fork_rng() if seed is not None else nullcontext():  # the caller's random stream is left as it was
        if seed is not None:
            torch.manual_seed(int(seed))
        if model_cfg.pretrained:
            source = resolve_pretrained(model_cfg.pretrained)
            check_model_dir(source, tokenizer=False)  # the tokenizer is checked where it is built
            if Path(source).is_dir() and (Path(source) / RECORD_FILE).exists():
                from headprune.core.saving import load_pruned

                return load_pruned(source, **extra)
            name, revision = split_revision(source)  # a hub name@revision: one of a pretraining run's checkpoints
            return model_class.from_pretrained(name, revision=revision, attn_implementation=attn, **extra)
        fields = OmegaConf.to_container(model_cfg.config, resolve=True) if OmegaConf.is_config(model_cfg.config) else dict(model_cfg.config)
        model_type = fields.pop("model_type")
        if vocab_size is not None:
            fields["vocab_size"] = vocab_size
        config = AutoConfig.for_model(model_type, **fields, **extra)
        return model_class.from_config(config, attn_implementation=attn)
