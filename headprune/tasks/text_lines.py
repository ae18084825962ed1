"""UTF-8 text files read line by line, with errors that name the file and the line (gzip too)."""

import gzip
from pathlib import Path


class TextFileError(ValueError):
    """A data file that cannot be read as UTF-8 text, with the file and the line."""


def decode_line(raw: bytes, path, number: int) -> str:
    """One line as text, or a TextFileError naming ``path:number`` and the bad byte."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        bad = raw[err.start : err.start + 1].hex()
        raise TextFileError(
            f"{path}:{number}: not valid UTF-8 (byte 0x{bad} at column {err.start + 1}); re-save the file as UTF-8"
        ) from None


def utf8_lines(path: str | Path):
    """Yield (line number, text with its line ending) of a UTF-8 (optionally gzip) file."""
    path = Path(path)
    with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            yield number, decode_line(raw, path, number)


def check_utf8(path: str | Path) -> int:
    """Read the whole file as UTF-8 (a TextFileError at the first bad line); returns the number of lines."""
    count = 0
    for count, _line in utf8_lines(path):  # noqa: B007 - the last count is the answer
        pass
    return count
