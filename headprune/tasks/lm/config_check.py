"""The language-modelling task's config check: task.* and data.* settings, its text files, lengths the model can take."""

from headprune.core.checks import ConfigError, boolean, check_schema, choice, integer, no_duplicates, optional, rule, string_list, text
from headprune.models.sources import max_positions
from headprune.tasks.config_check import check_length_fits
from headprune.tasks.data_sources import JSON_LINES, check_hub_dataset, dir_setting

SOURCES = ("local", "hub", "synthetic")
SCHEMA = {
    "task.mask_chunk": rule(integer, low=1),
    "task.decode_tokens": rule(integer, low=1),
    "task.decode_prompt_tokens": rule(integer, low=1),
    "task.selection_split": rule(choice, choices=("importance", "heldout")),
    "data.source": rule(choice, choices=SOURCES),
    "data.seed": rule(integer),
    "data.max_length": rule(integer, low=2),
    "data.document_tokens": optional(rule(integer, low=2)),
    "data.add_bos": rule(boolean),
    "data.add_eos": rule(boolean),
    "data.batch_size": rule(integer, low=1),
    "data.eval_batch_size": rule(integer, low=1),
    "data.tokenizer.vocab_size": rule(integer, low=1),
    "data.text_field": rule(text),
    "data.json_fields": optional(rule(string_list, empty=False)),
    **{f"data.limits.{split}": optional(rule(integer, low=1)) for split in ("eval", "eval_other", "importance", "heldout", "train")},
    **{f"data.synthetic.sizes.{split}": rule(integer, low=1) for split in ("eval", "eval_other", "importance", "heldout", "train")},
}


def check(cfg, files: bool = True, importance: bool = True) -> None:
    """The LM settings, every split's texts (readable, UTF-8, not empty) and prompt + new tokens within the model's positions."""
    check_schema(cfg, SCHEMA)
    check_json_fields(cfg.data)
    check_lengths(cfg)
    if files and cfg.data.get("source") in ("local", "synthetic"):
        check_texts(cfg.data)
    if files and cfg.data.get("source") == "hub":
        check_hub_dataset(cfg.data, cfg.data.get("hub_path"), "data.hub_path", "data=lm_local (text files) or data=lm_synthetic")


def check_json_fields(data) -> None:
    """``data.json_fields`` names each field once, and only where data.files names a JSON-lines file to read them from."""
    fields = data.get("json_fields")
    if fields is None:
        return
    no_duplicates(fields, "data.json_fields", "give each field once")
    files = (data.get("files") or {}).values() if data.get("source") == "local" else []
    listed = [name for names in files if names is not None for name in ([names] if isinstance(names, str) else names)]
    if not any(str(name).endswith(JSON_LINES) for name in listed):
        raise ConfigError(
            f"data.json_fields={list(fields)} is read from JSON-lines files ({', '.join(JSON_LINES)}) in data.files only, "
            f"and data={data.get('name')} names none: it would be ignored; drop it"
        )


def check_lengths(cfg) -> None:
    """Decoding (prompt + new tokens) and the evaluated texts must fit the model's position embeddings."""
    positions = max_positions(cfg.model)
    task = cfg.get("task") or {}
    length, document = cfg.data.get("max_length"), cfg.data.get("document_tokens")
    if isinstance(length, int) and isinstance(document, int) and document > length:
        raise ConfigError(
            f"data.document_tokens={document}, but data.max_length={length} cuts every text to {length} tokens: set "
            f"data.max_length>={document} or data.document_tokens<={length}"
        )
    prompt, new = task.get("decode_prompt_tokens"), task.get("decode_tokens")
    if positions is not None and prompt is not None and new is not None and prompt + new > positions:
        raise ConfigError(
            f"task.decode_prompt_tokens={prompt} + task.decode_tokens={new} = {prompt + new} tokens, but model "
            f"{cfg.model.get('name')} takes at most {positions} positions: lower task.decode_tokens to at most {max(positions - prompt, 0)}"
        )
    check_length_fits(cfg, "max_length", "text")


def check_texts(data) -> None:
    """Every split's texts readable before any work, and none empty (the error names its files)."""
    from headprune.tasks.lm.data import load_texts, text_pools

    try:
        texts = load_texts(data)
        pools = text_pools(data) if data.get("document_tokens") is not None else None  # documents join every line first
    except (ValueError, OSError) as err:
        raise ConfigError(f"data={data.get('name')}: {err}") from None
    if pools is not None:
        check_documents(data, {split: [text for _, text in items] for split, items in pools.items()})
    for split, lines in texts.items():
        if not lines:
            files = (data.get("files") or {}).get(split)
            where = f"data.files.{split}={list(files) if files is not None and not isinstance(files, str) else files}"
            raise ConfigError(
                f"data={data.get('name')}: the {split} split holds no text ({where} has no non-empty line under "
                f"{dir_setting(data)}={data.get('dir')}): give files with one text per line"
            )


def check_documents(data, texts: dict[str, list[str]]) -> None:
    """Every split's text can hold a document of ``data.document_tokens`` tokens (a token is at least one byte of text)."""
    tokens = int(data.document_tokens)
    for split, lines in texts.items():
        size = sum(len(line.encode()) for line in lines)
        if 0 < size < tokens:
            raise ConfigError(
                f"data={data.get('name')}: the {split} split holds {size} bytes of text, fewer than one document of "
                f"data.document_tokens={tokens} tokens: give it more text (data.files.{split}) or lower data.document_tokens"
            )
