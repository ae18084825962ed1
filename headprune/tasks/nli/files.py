"""Read NLI examples from local files: JSON Lines (optionally gzip) and GLUE's MNLI TSV layout."""

import csv
import json
import sys
from pathlib import Path

from headprune.core.checks import DataError
from headprune.tasks.data_sources import utf8_lines

LABELS = ("entailment", "neutral", "contradiction")
EXTENSIONS = (".jsonl", ".jsonl.gz", ".json", ".json.gz", ".tsv", ".tsv.gz")
PREMISE_KEYS = ("premise", "sentence1")  # JSONL / simple TSV name first, then GLUE's
HYPOTHESIS_KEYS = ("hypothesis", "sentence2")
LABEL_KEYS = ("label", "gold_label")


class NLIDataError(DataError):
    """A data file or data setting that cannot be used, with the file and line when there is one."""


def label_id(value, where: str) -> int:
    """Map a label name (any case) or id (int or digit string) to 0/1/2, or raise listing the valid labels."""
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) and 0 <= value < len(LABELS):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in LABELS:
            return LABELS.index(text)
        if text.isdigit() and int(text) < len(LABELS):
            return int(text)
    valid = ", ".join(f"{name} ({i})" for i, name in enumerate(LABELS))
    raise NLIDataError(f"{where}: unknown label {value!r}; valid labels are {valid} (names or ids)")


def find_split_file(directory: str | Path, stem: str, split: str) -> Path:
    """The file holding one split: ``<dir>/<stem><ext>`` for the first extension that exists."""
    directory = Path(directory)
    candidates = [directory / f"{stem}{ext}" for ext in EXTENSIONS]
    for path in candidates:
        if path.is_file():
            return path
    looked = ", ".join(p.name for p in candidates)
    hint = "" if directory.is_dir() else f" (the directory {directory} does not exist)"
    raise FileNotFoundError(f"no file for the {split!r} split: looked for {looked} in {directory}{hint}")


def present_split_files(directory: str | Path, files, splits, required):
    """(split, path) of every split whose file is found, in ``splits`` order; a missing ``required`` file raises FileNotFoundError."""
    for split in splits:
        stem = files.get(split)
        if not stem:
            continue
        try:
            path = find_split_file(directory, stem, split)
        except FileNotFoundError:
            if split in required:
                raise
            continue
        yield split, path


def _pick(row: dict, keys: tuple[str, ...], where: str, what: str):
    for key in keys:
        if key in row and row[key] is not None:
            return row[key]
    raise NLIDataError(f"{where}: missing field {what!r} (one of {list(keys)}); the row has {sorted(row)}")


def _add(out: dict, row: dict, where: str) -> None:
    premise = _pick(row, PREMISE_KEYS, where, "premise")
    hypothesis = _pick(row, HYPOTHESIS_KEYS, where, "hypothesis")
    if not isinstance(premise, str) or not isinstance(hypothesis, str):
        raise NLIDataError(f"{where}: premise and hypothesis must be strings, got {type(premise).__name__} and {type(hypothesis).__name__}")
    out["premise"].append(premise)
    out["hypothesis"].append(hypothesis)
    out["label"].append(label_id(_pick(row, LABEL_KEYS, where, "label"), where))


def read_jsonl(path: str | Path, limit: int | None = None) -> dict[str, list]:
    """Examples from a JSON Lines file (one object per line with premise, hypothesis, label); blank lines are skipped."""
    path = Path(path)
    out = {"premise": [], "hypothesis": [], "label": []}
    for number, line in utf8_lines(path):
        if limit is not None and len(out["label"]) >= limit:
            break
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise NLIDataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict):
            raise NLIDataError(f"{where}: expected a JSON object with premise, hypothesis and label, got {type(row).__name__}")
        _add(out, row, where)
    return out


def read_tsv(path: str | Path, limit: int | None = None) -> dict[str, list]:
    """Examples from a TSV with a header: GLUE's MNLI layout (sentence1, sentence2, gold_label) or premise/hypothesis/label."""
    path = Path(path)
    out = {"premise": [], "hypothesis": [], "label": []}
    csv.field_size_limit(sys.maxsize)
    reader = csv.reader((line for _, line in utf8_lines(path)), delimiter="\t", quoting=csv.QUOTE_NONE)  # GLUE's TSVs contain bare quotes
    header = next(reader, None)
    if header is None:
        raise NLIDataError(f"{path}:1: empty file, expected a header row")
    header = [h.strip() for h in header]
    for keys, what in ((PREMISE_KEYS, "premise"), (HYPOTHESIS_KEYS, "hypothesis"), (LABEL_KEYS, "label")):
        if not any(k in header for k in keys):
            raise NLIDataError(f"{path}:1: the header has no {what} column (one of {list(keys)}); it has {header}")
    for number, cells in enumerate(reader, start=2):
        if limit is not None and len(out["label"]) >= limit:
            break
        if not cells or cells == [""]:
            continue
        if len(cells) < len(header):
            raise NLIDataError(f"{path}:{number}: expected {len(header)} tab-separated columns (as in the header), got {len(cells)}")
        _add(out, dict(zip(header, cells)), f"{path}:{number}")
    return out


def read_split(path: str | Path, limit: int | None = None) -> dict[str, list]:
    """Examples from one split file, the reader chosen by the file name."""
    name = Path(path).name
    stem = name[:-3] if name.endswith(".gz") else name
    if stem.endswith(".tsv"):
        return read_tsv(path, limit)
    return read_jsonl(path, limit)
