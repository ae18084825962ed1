"""llama.cpp's pre-tokenizer for a tokenizer (GGUF ``tokenizer.ggml.pre``): a name llama.cpp knows, or the one its converter identifies."""

from difflib import get_close_matches
from hashlib import sha256

from headprune.core.checks import ConfigError
from headprune.export.llama_cpp_pre import CHKTXT, KNOWN, NAME_BY_HASH, SOURCE

EXAMPLES = "llama-bpe (Llama 3), qwen2, smollm, gpt-2"


def chktxt_hash(tokenizer) -> str:
    """sha256 of the tokenizer's ids of llama.cpp's check text, as convert_hf_to_gguf computes it (special tokens added)."""
    return sha256(str(tokenizer.encode(CHKTXT)).encode()).hexdigest()


def identify(tokenizer) -> tuple[str | None, str]:
    """(the name llama.cpp's converter gives ``tokenizer``, None when its table has no name llama.cpp knows; the hash)."""
    digest = chktxt_hash(tokenizer)
    name = NAME_BY_HASH.get(digest)
    return (name if name in KNOWN else None), digest


def known_name(name: str, where: str = "export.tokenizer_pre") -> str:
    """``name`` when llama.cpp knows it as a BPE pre-tokenizer (it refuses, or older builds read ``default`` for, any other)."""
    if name not in KNOWN:
        close = get_close_matches(name, KNOWN, n=3)
        raise ConfigError(
            f"{where}={name} is no pre-tokenizer llama.cpp knows (it refuses the file, or an older build tokenizes as 'default'): "
            + (f"did you mean {', '.join(close)}? " if close else "")
            + f"give one of llama.cpp's names ({SOURCE}), e.g. {EXAMPLES}"
        )
    return name


def unknown_message(what: str, digest: str | None, setting: str = "export.tokenizer_pre") -> str:
    """Why a tokenizer no name fits is refused (``digest``: its converter hash; None: trained by the task), and how to name it."""
    if digest:
        found = f"the sha256 of its ids of llama.cpp's check text, {digest[:16]}..., is not in llama.cpp's converter's table"
    else:
        found = "it is trained by the task, so llama.cpp has no name for it"
    return (
        f"export.format=gguf: llama.cpp splits text by the GGUF's pre-tokenizer name, and the tokenizer of {what} has none "
        f"headprune can tell ({found}): set {setting}=<the name whose splitting matches it>, e.g. {EXAMPLES}"
    )


def pre_tokenizer_of(tokenizer, given: str | None) -> str:
    """The name to write for ``tokenizer``: ``given`` (a name llama.cpp knows), else the converter's, else a ValueError."""
    if given:
        return known_name(given, "tokenizer_pre")
    name, digest = identify(tokenizer)
    if name is None:
        raise ValueError(unknown_message(type(tokenizer).__name__, digest, "tokenizer_pre"))
    return name


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
