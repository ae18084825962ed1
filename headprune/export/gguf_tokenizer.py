"""The pre-tokenizer a GGUF export writes (``tokenizer.ggml.pre``), chosen before work and never ``default`` in silence."""

from headprune.core.checks import ConfigError
from headprune.export.gguf_pre import identify, known_name, unknown_message


def choose_tokenizer_pre(settings, model_cfg) -> dict:
    """{name, how, identified, sha256} of the pre-tokenizer to write and where it comes from; a ConfigError when none fits."""
    from headprune.models.embedded import EMBEDDED_LLMS
    from headprune.models.sources import resolve_pretrained
    from headprune.models.tokenizer_origin import read_origin
    from headprune.models.tokenizers import load_tokenizer

    given = settings.get("tokenizer_pre")
    source = model_cfg.get("tokenizer")
    identified = digest = None
    if source:
        identified, digest = identify(load_tokenizer(str(source)))
    if given:
        return {"name": known_name(str(given)), "how": "export.tokenizer_pre", "identified": identified, "sha256": digest}
    if not source:
        raise ConfigError(unknown_message(f"model={model_cfg.get('name')}", None))
    origin = read_origin(source if str(source) in EMBEDDED_LLMS else resolve_pretrained(str(source), "model.tokenizer"))
    if origin and origin.get("tokenizer_pre"):
        name = known_name(str(origin["tokenizer_pre"]), f"the pre-tokenizer recorded for model.tokenizer={source} ({origin.get('from')})")
        return {"name": name, "how": str(origin.get("from")), "identified": identified, "sha256": digest}
    if identified is None:
        raise ConfigError(unknown_message(f"model.tokenizer={source}", digest))
    how = "identified as llama.cpp's convert_hf_to_gguf does (sha256 of its ids of the converter's check text)"
    return {"name": identified, "how": how, "identified": identified, "sha256": digest}
