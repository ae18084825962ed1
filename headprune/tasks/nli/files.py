"""Read NLI examples from local files: JSON Lines (optionally gzip) and GLUE's MNLI TSV layout."""

import csv
import json
import sys
from itertools import islice
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


def present_split_files(directory: str | Path, files, splits, required):
    """(split, ``<dir>/<stem><ext>`` of the first extension found) per split with a file; a missing ``required`` one: FileNotFoundError."""
    directory = Path(directory)
    for split in splits:
        stem = files.get(split)
        if not stem:
            continue
        candidates = [directory / f"{stem}{ext}" for ext in EXTENSIONS]
        path = next((candidate for candidate in candidates if candidate.is_file()), None)
        if path is not None:
            yield split, path
        elif split in required:
            looked = ", ".join(p.name for p in candidates)
            hint = "" if directory.is_dir() else f" (the directory {directory} does not exist)"
            raise FileNotFoundError(f"no file for the {split!r} split: looked for {looked} in {directory}{hint}")


def _pick(row: dict, keys: tuple[str, ...], where: str, what: str):
    for key in keys:
        if key in row and row[key] is not None:
            return row[key]
    raise NLIDataError(f"{where}: missing field {what!r} (one of {list(keys)}); the row has {sorted(row)}")


def jsonl_rows(path: Path):
    """(where, row) of each object of a JSON Lines file (one per line with premise, hypothesis, label); blank lines are skipped."""
    for number, line in utf8_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise NLIDataError(f"{where}: not valid JSON ({err.msg} at column {err.colno})") from None
        if not isinstance(row, dict):
            raise NLIDataError(f"{where}: expected a JSON object with premise, hypothesis and label, got {type(row).__name__}")
        yield where, row


def tsv_rows(path: Path):
    """(where, row) of each line of a TSV with a header: GLUE's MNLI layout (sentence1, sentence2, gold_label) or premise/hypothesis/label."""
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
        if not cells or cells == [""]:
            continue
        if len(cells) < len(header):
            raise NLIDataError(f"{path}:{number}: expected {len(header)} tab-separated columns (as in the header), got {len(cells)}")
        yield f"{path}:{number}", dict(zip(header, cells))


def read_split(path: str | Path, limit: int | None = None) -> dict[str, list]:
    """Examples {"premise", "hypothesis", "label"} of one split file (the first ``limit``), the reader chosen by the file name."""
    path = Path(path)
    stem = path.name[:-3] if path.name.endswith(".gz") else path.name
    out = {"premise": [], "hypothesis": [], "label": []}
    for where, row in islice(tsv_rows(path) if stem.endswith(".tsv") else jsonl_rows(path), limit):  # no row read past the limit
        premise = _pick(row, PREMISE_KEYS, where, "premise")
        hypothesis = _pick(row, HYPOTHESIS_KEYS, where, "hypothesis")
        if not isinstance(premise, str) or not isinstance(hypothesis, str):
            raise NLIDataError(
                f"{where}: premise and hypothesis must be strings, got {type(premise).__name__} and {type(hypothesis).__name__}"
            )
        out["premise"].append(premise)
        out["hypothesis"].append(hypothesis)
        out["label"].append(label_id(_pick(row, LABEL_KEYS, where, "label"), where))
    return out
