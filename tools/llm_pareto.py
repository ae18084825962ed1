"""Perplexity against measured generation speed of GGUF files in llama.cpp: the Pareto curve and its table.

    python tools/llm_pareto.py --speed <numbers.json> [--perplexity <numbers.json> ...] --out <figure.png>
        [--perplexity-value "kv-only f16=74.48"] [--reference "control=69.13"] [--title ...]

The inputs are ``tools/llamacpp_numbers.py --out`` files: ``--speed`` one with speed (pp512 / tg128), ``--perplexity``
any with perplexity (the speed file's own perplexity is read too; a later file wins). Files are named
``<model> <format>`` (``kv+ffn@0.8 f16``, ``unpruned q8_0``): one series per format, each joined along its Pareto
front (no other file of the format both faster and lower in perplexity). Prints a Markdown table: each file's
perplexity, prompt and generation tokens/s (medians), the gain of the medians over ``unpruned <format>``, and whether it
is on its format's front. ``--reference label=value`` draws a horizontal line (the control's perplexity).
``--perplexity-value "<model> <format>=value"`` gives a timed file the perplexity measured on another file of the same
architecture (llama.cpp's speed does not read the weights: a pruned model's mask on the unpruned weights times as the
recovered model runs).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def split_name(name: str) -> tuple[str, str]:
    """(model, format) of a file name ``<model> <format>``."""
    model, _, fmt = name.rpartition(" ")
    if not model:
        raise SystemExit(f"file name {name!r} is not '<model> <format>' (e.g. 'unpruned f16')")
    return model, fmt


def perplexities(paths: list[Path]) -> dict[str, float]:
    """{file name: llama.cpp perplexity} from llamacpp_numbers.py outputs (a later file wins)."""
    found = {}
    for path in paths:
        for name, row in json.loads(path.read_text())["files"].items():
            if "perplexity" in row:
                found[name] = float(row["perplexity"]["perplexity"])
    return found


def rows_of(speed: dict, perplexity: dict[str, float]) -> list[dict]:
    """One row per timed file: model, format, perplexity, pp and tg medians, gains over the unpruned file of its format."""
    files = speed["speed"]["files"]
    missing = [name for name in files if name not in perplexity]
    if missing:
        raise SystemExit(f"no perplexity for {missing}: give the llamacpp_numbers.py output that measured it with --perplexity")
    rows = []
    for name, got in files.items():
        model, fmt = split_name(name)
        rows.append(
            {
                "name": name,
                "model": model,
                "format": fmt,
                "perplexity": perplexity[name],
                "pp": got["pp"]["median"],
                "tg": got["tg"]["median"],
            }
        )
    for row in rows:
        base = next((r for r in rows if r["format"] == row["format"] and r["model"] == "unpruned"), None)
        for kind in ("pp", "tg"):
            row[f"{kind}_gain"] = row[kind] / base[kind] - 1 if base else None
    return rows


def on_front(rows: list[dict]) -> list[bool]:
    """Whether each row is on its format's Pareto front (lower perplexity, higher tg)."""
    from headprune.viz.tables import pareto_front

    flags = [False] * len(rows)
    for fmt in dict.fromkeys(r["format"] for r in rows):
        mine = [i for i, r in enumerate(rows) if r["format"] == fmt]
        points = [{"score": rows[i]["perplexity"], "predicted_speedup": rows[i]["tg"]} for i in mine]
        for i, best in zip(mine, pareto_front(points, higher_is_better=False)):
            flags[i] = best
    return flags


def table(rows: list[dict], front: list[bool]) -> str:
    """Markdown: file, perplexity, pp and tg medians with their gains over the unpruned file of the format, front."""
    lines = [
        "| model | format | perplexity (llama.cpp) | prompt tok/s | gain | generation tok/s | gain | Pareto |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for row, best in zip(rows, front):
        gains = [f"{100 * row[k]:+.1f}%" if row[k] is not None and row["model"] != "unpruned" else "" for k in ("pp_gain", "tg_gain")]
        cells = [row["model"], row["format"], f"{row['perplexity']:.2f}", f"{row['pp']:.1f}", gains[0], f"{row['tg']:.1f}", gains[1]]
        lines.append("| " + " | ".join(cells + ["yes" if best else ""]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from headprune.viz.plots import tradeoff_figure

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speed", type=Path, required=True)
    parser.add_argument("--perplexity", type=Path, action="append", default=[])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reference", action="append", default=[], help="label=perplexity: a horizontal line")
    parser.add_argument("--perplexity-value", action="append", default=[], help="'<model> <format>=value': a perplexity measured elsewhere")
    parser.add_argument("--title", default="SmolLM2-135M in llama.cpp: perplexity against generation speed")
    args = parser.parse_args(argv)
    speed = json.loads(args.speed.read_text())
    if "speed" not in speed:
        parser.error(f"{args.speed} has no speed: run tools/llamacpp_numbers.py without --no-speed")
    given = perplexities([args.speed, *args.perplexity])
    for item in args.perplexity_value:
        name, _, value = item.rpartition("=")
        split_name(name)  # '<model> <format>', or the error that says so
        given[name] = float(value)
    rows = rows_of(speed, given)
    references = {}
    for item in args.reference:
        label, _, value = item.rpartition("=")
        if not label:
            parser.error(f"--reference takes label=value, got {item!r}")
        references[label] = float(value)
    settings = speed["speed"]
    series = {}
    for row in rows:
        series.setdefault(row["format"], []).append({"label": row["model"], "speed": row["tg"], "score": row["perplexity"]})
    flash = "flash attention on" if settings.get("flash_attn") else "flash attention off"
    xlabel = f"generation tokens/s (tg{settings['gen']}, {settings['threads']} threads, {flash})"
    tradeoff_figure(series, args.out, args.title, xlabel, "perplexity (llama.cpp)", references)
    print(table(rows, on_front(rows)))
    print(f"\nfigure: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
