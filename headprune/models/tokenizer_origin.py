"""Where a tokenizer came from, kept beside the models headprune saves: llama.cpp's name for its pre-tokenizer."""

import json
from pathlib import Path

from headprune.models.embedded import DONE_FILE, EMBEDDED_LLMS, gguf_file

RECORD = "headprune_tokenizer.json"


def embedded_origin(name: str) -> dict | None:
    """The record of an embedded LLM's tokenizer: its package GGUF's pre-tokenizer (None when the file names none)."""
    from gguf import GGUFReader

    path = gguf_file(name)
    field = GGUFReader(str(path)).fields.get("tokenizer.ggml.pre")
    if field is None:
        return None
    return {"tokenizer_pre": str(field.contents()), "from": f"tokenizer.ggml.pre of {path.name} ({EMBEDDED_LLMS[name]})"}


def read_origin(source) -> dict | None:
    """Where the tokenizer of ``source`` (an embedded name, or a directory) came from: its record, or None when unknown."""
    if not source:
        return None
    source = str(source)
    if source in EMBEDDED_LLMS:
        return embedded_origin(source)
    folder = Path(source).expanduser()
    if (folder / RECORD).is_file():
        return json.loads((folder / RECORD).read_text(encoding="utf-8"))
    done = folder.is_dir() and (folder / DONE_FILE).is_file()  # an embedded LLM's converted cache: <name>-<gguf stem>, done file
    embedded = next((name for name in EMBEDDED_LLMS if done and folder.name.startswith(f"{name}-")), None)
    return embedded_origin(embedded) if embedded else None


def keep_origin(tokenizer, folder: str | Path) -> dict | None:
    """Write into ``folder`` the record of the directory ``tokenizer`` was loaded from (its ``name_or_path``), when known."""
    loaded_from = str(getattr(tokenizer, "name_or_path", "") or "")
    origin = read_origin(loaded_from) if loaded_from and Path(loaded_from).expanduser().is_dir() else None
    if origin is not None:
        (Path(folder) / RECORD).write_text(json.dumps(origin, indent=1), encoding="utf-8")
    return origin
