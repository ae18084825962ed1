"""docs/results_llm.md's llama.cpp generation gains beside their bandwidth-ideal, from the committed speed runs.

The GGUF files of those runs are not committed: each file's bytes are counted from the widths its mask keeps
(tools/decode_ideal.py, which reproduces the Q8_0 files' sizes to their metadata). Each gain is the file's paired
generation gain over the unpruned file of the same format in the same run (the files took turns, repeat by repeat),
and, where the unpruned model was also timed written as ``deci``, over that file too: the same graph on both sides.
"""

from __future__ import annotations

import json
from pathlib import Path

from decode_ideal import decode_context, decode_ideal, file_bytes, kv_bytes_per_token, layer_widths

from headprune.engine.verdict import beyond_ideal, gain_summary, gain_text, verdict

ARCHITECTURES = {  # a timed file's name (less its format) -> (results file, order, step) of the mask it was exported from
    "unpruned": None,
    "unpruned-deci": None,  # the unpruned model written as deci (tools/gguf_as_deci.py): the graph without the pruning
    "uniform": ("lm_recovery_uniform", "importance", "33%"),
    "global": ("lm_recovery_global", "fisher", "33%"),
    "kv-only": ("lm_recovery_global", "fisher", "33%"),
    "kv+ffn@0.926": ("lm_units_kv_ffn", "fisher", "flops=0.926"),
    "kv+ffn@0.8": ("lm_units_kv_ffn_80", "fisher", "flops=0.8"),
    "kv+ffn@0.926/32": ("lm_units_kv_ffn_32", "fisher", "flops=0.926"),
}
FORMATS = ("f16", "q8_0")


def name_parts(name: str) -> tuple[str, str]:
    """("kv+ffn@0.8", "q8_0") of ``kv+ffn@0.8 q8_0``; a name without a format is an f16 file."""
    arch, _, fmt = name.rpartition(" ")
    return (arch, fmt) if fmt in FORMATS else (name, "f16")


def widths_of(results_dir: Path, arch: str) -> list[tuple[int, int]]:
    """The (KV groups, FFN neurons) per layer of a timed architecture, from its mask in docs/results/."""
    if arch not in ARCHITECTURES:
        raise KeyError(f"no mask known for the timed file {arch!r}: add it to ARCHITECTURES in tools/decode_ideal_table.py")
    source = ARCHITECTURES[arch]
    if source is None:
        return layer_widths(None)
    name, order, step = source
    points = json.loads((results_dir / f"{name}.json").read_text())["results"]["points"]
    return layer_widths(next(p["mask"] for p in points if p.get("order") == order and p.get("step") == step and p.get("mask")))


def ideal_rows(results_dir: Path, speed: dict) -> list[dict]:
    """Per timed file of one speed run: its bytes, its generation gain over each unpruned file of its format (the unpruned
    model as ``llama``, and as ``deci`` where timed), the ideal."""
    files, gen = speed["files"], speed["gen"]
    reads = {}
    for name in files:
        arch, fmt = name_parts(name)
        widths = widths_of(results_dir, arch)
        reads[name] = {**file_bytes(widths, fmt), "kv_per_token": kv_bytes_per_token(widths), "arch": arch, "fmt": fmt}
    rows = []
    names = list(files)
    for i, name in enumerate(names):
        fmt = reads[name]["fmt"]
        plain = ARCHITECTURES[reads[name]["arch"]] is None  # an unpruned file: measured against those listed before it only
        for reference in (n for n in (names[:i] if plain else names) if ARCHITECTURES[reads[n]["arch"]] is None and reads[n]["fmt"] == fmt):
            seconds = [[gen / rate for rate in files[n]["tg"]["rates"]] for n in (reference, name)]
            summary = gain_summary(*seconds)
            gain = {**summary, "verdict": verdict(summary)}
            ideal = decode_ideal(reads[reference], reads[name], decode_context(0, gen))
            rows.append({"file": name, "reference": reference, "bytes": reads[name], "gain": gain, "ideal": ideal})
    return rows


def ideal_table(results_dir: Path, runs: dict[str, dict]) -> str:
    """One row per timed file of each run ({label: speed}): weights, bytes read per token, gain, ideal, verdict."""
    lines = [
        "| run | file | weights | MB read per token | generation gain over the unpruned file [95%] | bandwidth-ideal | verdict |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    for label, speed in runs.items():
        for row in ideal_rows(results_dir, speed):
            above = beyond_ideal(row["gain"], row["ideal"])
            word = "above its ideal: to be re-measured, not a result" if above else "at or below its ideal"
            if row["gain"]["verdict"] == "inconclusive":
                word = "inconclusive"
            over = "" if name_parts(row["reference"])[0] == "unpruned" else f" over {row['reference']}"
            lines.append(
                f"| {label} | {row['file']}{over} | {row['bytes']['weights'] / 1e6:.1f}M | {row['bytes']['read_per_token'] / 1e6:.1f} | "
                f"{gain_text(row['gain'])} | {100 * row['ideal']:+.1f}% | {word} |"
            )
    return "\n".join(lines)


def llm_runs(results_dir: Path) -> dict[str, dict]:
    """{label: speed} of the committed llama.cpp speed runs of docs/results_llm.md sections 7 and 8."""
    section7 = json.loads((results_dir / "llm_llamacpp_speed.json").read_text())
    section8 = json.loads((results_dir / "llm_units_llamacpp.json").read_text())["speed"]
    runs = {f"7, flash {'on' if key == 'flash' else 'off'}": section7[key]["speed"] for key in ("noflash", "flash")}
    labels = {
        "f16": "8, f16, flash off",
        "f16_flash": "8, f16, flash on",
        "q8_0_flash": "8, Q8_0, flash on",
        "rounded_flash": "8, widths of 32",
    }
    runs.update({label: section8[key]["speed"] for key, label in labels.items()})
    recheck = json.loads((results_dir / "llm_units_llamacpp_recheck.json").read_text())
    runs.update({f"8, again, {fmt}": recheck[key]["speed"] for key, fmt in (("f16", "f16"), ("q8_0", "Q8_0"))})
    return runs
