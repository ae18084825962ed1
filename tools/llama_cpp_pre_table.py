"""Regenerate headprune/export/llama_cpp_pre.py from a llama.cpp source tree (its data: check text, hashes, names).

    python tools/llama_cpp_pre_table.py <llama.cpp dir> [--source "llama-cpp-python 0.3.36 (vendored llama.cpp)"]

Reads the converter's ``get_vocab_base_pre`` (``conversion/base.py``, or ``convert_hf_to_gguf.py`` in older trees):
its check text ``chktxt`` and every ``chkhsh`` with the ``tokenizer.ggml.pre`` name it gives; and the names
``src/llama-vocab.cpp`` accepts for a BPE vocabulary (any other name is refused by llama.cpp, or read as ``default``
by older builds). The llama.cpp sources ship in the ``llama-cpp-python`` sdist on PyPI (``vendor/llama.cpp``).
"""

from __future__ import annotations

import argparse
import ast
import re
import textwrap
from pathlib import Path

TARGET = Path(__file__).resolve().parents[1] / "headprune" / "export" / "llama_cpp_pre.py"


def converter_source(root: Path) -> str:
    """The text of the function ``get_vocab_base_pre`` of llama.cpp's converter."""
    for name in ("conversion/base.py", "convert_hf_to_gguf.py"):
        path = root / name
        if path.is_file() and "def get_vocab_base_pre" in (text := path.read_text(encoding="utf-8")):
            start = text.index("def get_vocab_base_pre")
            return text[start : text.index("if res is None", start)]
    raise SystemExit(f"no get_vocab_base_pre in {root}/conversion/base.py or {root}/convert_hf_to_gguf.py")


def read_table(root: Path) -> tuple[str, list[tuple[str, str, str]], list[str]]:
    """(chktxt, [(hash, name, reference model)], the names llama-vocab.cpp accepts)."""
    body = converter_source(root)
    chktxt = ast.literal_eval(re.search(r"chktxt = ('.*')\n", body).group(1))
    rows = re.findall(r'if chkhsh == "([0-9a-f]{64})":\s*\n\s*# ref: (\S+)\s*\n\s*res = "([^"]+)"', body)
    if len(rows) != body.count('chkhsh == "'):
        raise SystemExit("the converter's table has rows this script does not read: update its pattern")
    vocab = (root / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")
    known = list(dict.fromkeys(["default", *re.findall(r'tokenizer_pre == "([^"]+)"', vocab)]))
    last = {h: (h, name, ref) for h, ref, name in rows}  # the converter's ifs run in turn: a later row of one hash wins
    return chktxt, list(last.values()), known


def render(chktxt: str, rows: list[tuple[str, str, str]], known: list[str], source: str) -> str:
    """The data module's text (the names llama.cpp knows as one word list: none holds a space)."""
    lines = [
        f'"""llama.cpp\'s pre-tokenizer names and its converter\'s hashes, from {source} (regenerated, not edited)."""',
        "",
        f"SOURCE = {source!r}",
        "",
        f"CHKTXT = {chktxt!r}",
        "",
        "KNOWN = tuple(",
        '    """',
        textwrap.fill(
            " ".join(known), 120, initial_indent="    ", subsequent_indent="    ", break_on_hyphens=False, break_long_words=False
        ),
        '    """.split()',
        ")",
        "",
        "NAME_BY_HASH = {",
        *[f"    {h!r}: {name!r},  # {ref}" for h, name, ref in rows],
        "}",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="a llama.cpp source tree (e.g. the llama-cpp-python sdist's vendor/llama.cpp)")
    parser.add_argument("--source", default="llama.cpp", help="what the tree is, written into the module")
    parser.add_argument("--out", type=Path, default=TARGET)
    args = parser.parse_args()
    chktxt, rows, known = read_table(args.root)
    args.out.write_text(render(chktxt, rows, known, args.source), encoding="utf-8")
    print(f"{args.out}: {len(rows)} hashes, {len(set(n for _, n, _ in rows))} names; {len(known)} names llama.cpp knows")


if __name__ == "__main__":
    main()
