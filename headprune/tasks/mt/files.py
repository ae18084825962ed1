"""Line-aligned parallel text files ``{split}.{lang}``: read them and check the alignment."""

from pathlib import Path

from headprune.tasks.data_sources import utf8_lines


class AlignmentError(ValueError):
    """Two parallel files that do not line up (different line counts or empty lines)."""


def _read_lines(path: Path) -> list[str]:
    """The lines of a UTF-8 file without their endings (a bad byte is an error naming the file and line)."""
    return [line.rstrip("\n").rstrip("\r") for _, line in utf8_lines(path)]


def split_files(data_dir: str | Path, split: str, src: str, tgt: str) -> tuple[Path, Path]:
    """The two files of one split, with a clear error when either is missing."""
    data_dir = Path(data_dir)
    src_file, tgt_file = data_dir / f"{split}.{src}", data_dir / f"{split}.{tgt}"
    missing = [str(p) for p in (src_file, tgt_file) if not p.is_file()]
    if missing:
        present = sorted(p.name for p in data_dir.iterdir()) if data_dir.is_dir() else []
        where = f"files there: {', '.join(present)}" if present else f"{data_dir} does not exist or is empty"
        raise FileNotFoundError(f"split {split!r} needs {' and '.join(missing)} ({where})")
    return src_file, tgt_file


def read_aligned(data_dir: str | Path, split: str, src: str, tgt: str) -> tuple[list[str], list[str]]:
    """Source and target sentences of ``{split}.{src}`` / ``{split}.{tgt}``, checked line by line."""
    src_file, tgt_file = split_files(data_dir, split, src, tgt)
    src_lines, tgt_lines = _read_lines(src_file), _read_lines(tgt_file)
    check_aligned(src_lines, tgt_lines, str(src_file), str(tgt_file))
    return src_lines, tgt_lines


def check_aligned(src_lines: list[str], tgt_lines: list[str], src_name: str = "source", tgt_name: str = "target") -> None:
    """Raise ``AlignmentError`` naming the files and (1-based) line numbers when the sides do not line up."""
    if len(src_lines) != len(tgt_lines):
        longer = src_name if len(src_lines) > len(tgt_lines) else tgt_name
        raise AlignmentError(
            f"{src_name} has {len(src_lines)} lines but {tgt_name} has {len(tgt_lines)}: parallel files must be aligned "
            f"line by line (line {min(len(src_lines), len(tgt_lines)) + 1} of {longer} has no counterpart)"
        )
    for name, lines in ((src_name, src_lines), (tgt_name, tgt_lines)):
        empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
        if empty:
            shown = ", ".join(map(str, empty[:10])) + (f" ... ({len(empty)} in all)" if len(empty) > 10 else "")
            raise AlignmentError(f"{name} has empty lines at line {shown}: every line must hold one sentence")
