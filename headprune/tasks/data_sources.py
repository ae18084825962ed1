"""Where a task's data comes from: its directory's setting, UTF-8 (gzip) text files by line or JSON row, hub datasets checked before work."""

import gzip
import json
from pathlib import Path

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError, DataError
from headprune.models.sources import hub_reachable


def dir_setting(data) -> str:
    """``data.dir`` when the data config's directory was given, ``paths.data_dir`` when it is the default under it."""
    if OmegaConf.is_config(data) and "dir" in data and OmegaConf.is_interpolation(data, "dir"):
        raw = str(OmegaConf.to_container(data, resolve=False)["dir"])
        if "paths.data_dir" in raw:
            return "paths.data_dir"
    return "data.dir"


def dir_advice(data, what: str) -> str:
    """How to point the data config at the directory holding ``what``, naming the setting that gave its directory."""
    if dir_setting(data) == "paths.data_dir":
        raw = OmegaConf.to_container(data, resolve=False)["dir"]
        return (
            f"the directory {data.get('dir')} is {raw}, under paths.data_dir (HEADPRUNE_DATA_DIR): set paths.data_dir to "
            f"the directory of your data copies, or data.dir=<directory with {what}>"
        )
    return f"point data.dir at the directory with {what} (data.dir={data.get('dir')} now)"


class TextFileError(DataError):
    """A data file that cannot be read as UTF-8 text, with the file and the line."""


def utf8_lines(path: str | Path):
    """Yield (line number, text with its line ending) of a UTF-8 (optionally gzip) file; a bad byte is a TextFileError naming ``path:number``."""
    path = Path(path)
    with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                bad = raw[err.start : err.start + 1].hex()
                raise TextFileError(
                    f"{path}:{number}: not valid UTF-8 (byte 0x{bad} at column {err.start + 1}); re-save the file as UTF-8"
                ) from None
            yield number, line


def present_file(path: str | Path, what: str) -> Path:
    """``path`` when it is a file, else a FileNotFoundError naming ``what`` and the files beside it."""
    path = Path(path)
    if not path.is_file():
        present = sorted(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else []
        where = f"files there: {', '.join(present)}" if present else f"{path.parent} does not exist or is empty"
        raise FileNotFoundError(f"{what} {path} not found ({where})")
    return path


def read_texts(path: str | Path, what: str = "language-modelling text file") -> list[str]:
    """The non-empty lines of a UTF-8 (optionally gzip) text file (one text per line); a missing ``what`` lists the files beside it."""
    path = present_file(path, what)
    return [line.strip() for _, line in utf8_lines(path) if line.strip()]  # a bad byte names the file and line


JSON_LINES = (".jsonl", ".jsonl.gz")  # file endings read as one JSON object per line (their data.json_fields are the texts)


def json_texts(path: str | Path, fields: list[str]) -> list[str]:
    """The distinct non-empty ``fields`` strings of each row of a JSON-lines (optionally gzip) file, in file order; a bad row names ``path:line``."""
    texts: dict[str, None] = {}  # ordered and distinct: a premise shared by several rows is one text
    for number, line in utf8_lines(path):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise TextFileError(f"{path}:{number}: not a JSON object ({err.msg}); each line must hold one JSON object") from None
        missing = [field for field in fields if not isinstance(row, dict) or not isinstance(row.get(field), str)]
        if missing:
            held = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise TextFileError(f"{path}:{number}: no text field {missing} (the row holds {held}); set data.json_fields to its text fields")
        texts.update((text, None) for text in (row[field].strip() for field in fields) if text)
    return list(texts)


def split_files(files, splits, evaluated: tuple[str, ...], what: str, overlap: str, error=ValueError) -> dict[str, list[str]]:
    """``data.files`` as {split: [file names]} (null: no such split): known splits only, the ``evaluated`` splits' files in no other."""
    files = {split: [paths] if isinstance(paths, str) else list(paths) for split, paths in dict(files or {}).items() if paths is not None}
    unknown = sorted(set(files) - set(splits))
    if unknown:
        raise error(f"data.files has unknown split(s) {unknown}; the {what} splits are {list(splits)}")
    shared = {p for s in evaluated for p in files.get(s, [])} & {p for s, paths in files.items() if s not in evaluated for p in paths}
    if shared:
        raise error(f"data.files uses {sorted(shared)} {overlap}")
    return files


def listed_texts(data, directory, split: str, name: str, what: str = "language-modelling text file") -> list[str]:
    """The texts of ``data.files.<split>``'s file ``name`` under ``directory`` (a JSON-lines file: its ``data.json_fields``); a missing one names the setting."""
    path, fields = Path(directory) / name, data.get("json_fields")
    try:
        if not name.endswith(JSON_LINES):
            return read_texts(path, what)
        if not fields:
            raise ValueError(f"data.files.{split} names the JSON-lines file {name}: set data.json_fields to the fields that hold its texts")
        return json_texts(present_file(path, what), list(fields))
    except FileNotFoundError as err:
        raise FileNotFoundError(
            f"{err}: data.files.{split} names {name}; {dir_advice(data, name)}, or name your files in data.files.{split}"
        ) from None


def hub_texts(path: str, name: str | None, splits: dict, field: str) -> dict[str, list[str]]:
    """{split: the non-empty ``field`` texts (stripped) of the Hugging Face dataset ``path`` (``name``) split ``splits[split]``}."""
    from datasets import load_dataset

    texts = {}
    for split, hub_split in splits.items():
        rows = load_dataset(path, name, split=hub_split)
        texts[split] = [t.strip() for t in rows[field] if t and t.strip()]
    return texts


def datasets_cache_dir(path: str) -> Path:
    """Where ``datasets.load_dataset(path)`` keeps its prepared copy (what it reads when the hub cannot be reached)."""
    import datasets
    from datasets.naming import camelcase_to_snakecase

    parts = path.split("/")
    parts[-1] = camelcase_to_snakecase(parts[-1])
    return Path(datasets.config.HF_DATASETS_CACHE).expanduser() / "___".join(parts)


def check_hub_dataset(data, path, setting: str, instead: str) -> None:
    """A hub dataset that can be loaded now (local, cached or reachable); else a ConfigError naming it and ``instead``."""
    path = str(path)
    if Path(path).expanduser().exists() or any(p.is_dir() for p in datasets_cache_dir(path).glob("*/*/*")) or hub_reachable():
        return
    raise ConfigError(
        f"data={data.get('name')}: the Hugging Face dataset {setting}={path} is not in the datasets cache "
        f"({datasets_cache_dir(path).parent}) and the hub cannot be reached (offline): run once on a machine with a "
        f"network (the copy is cached there; set HF_DATASETS_CACHE to reuse it), or use {instead}"
    )
