"""docs/results_llm.md's llama.cpp generation of a cut vocabulary per byte of text, beside per token and the ideals.

A smaller vocabulary splits the same text into more tokens, so a token generated faster is worth fewer bytes. The
tokens each tokenizer spends per byte of the `eval` text come from the prune run that cut it: its point scored through
its own tokenizer records the predicted tokens, bits per byte and perplexity, so the text's bytes are
ln(perplexity) x tokens / (ln 2 x bits per byte); the unpruned model's tokens follow from its own two measures on
the same bytes. A gain per byte is then (1 + gain per token) x (unpruned tokens / cut tokens) - 1, its interval and its
bandwidth-ideal scaled alike.
"""

from __future__ import annotations

import math

from headprune.engine.verdict import gain_text
from headprune.results.points import point_name


def tokens_per_byte(point: dict, base_score: float, base_bits_per_byte: float) -> tuple[float, float]:
    """(unpruned, cut) eval tokens per byte of text, from a point scored through its own tokenizer and the unpruned scores."""
    tokens = point["tokenizer"]["data"]["predicted_tokens"]
    text_bytes = math.log(point["score"]) * tokens / (math.log(2) * point["bits_per_byte"])
    unpruned_tokens = base_bits_per_byte * math.log(2) * text_bytes / math.log(base_score)
    return unpruned_tokens / text_bytes, tokens / text_bytes


def greedy_tokens_per_byte(run: dict, step_index: int = -1) -> tuple[float, float]:
    """``tokens_per_byte`` of a step of a vocabulary prune run's first order (fractions)."""
    results = run["results"]
    step = results["orders"][next(iter(results["orders"]))]["steps"][step_index]
    return tokens_per_byte(step, results["base_score"], results["base_bits_per_byte"])


def pareto_tokens_per_byte(run: dict, name: str) -> tuple[float, float]:
    """``tokens_per_byte`` of the point ``name`` (``fisher+reconstruct@bytes=0.75``) of a run pruning for speed."""
    points = run["results"]["points"]
    base = next(p for p in points if p["order"] == "unpruned")
    point = next(p for p in points if f"{point_name(p)}@{p['step']}" == name)
    return tokens_per_byte(point, base["score"], base["bits_per_byte"])


def per_byte_table(speed_run: dict, tokens: tuple[float, float], labels: dict[str, str]) -> str:
    """One row per timed file ({name in the speed run: label}; the first the unpruned reference): generation per token and
    per byte of text, each beside its ideal; ``tokens``: (unpruned, cut) tokens per byte of text."""
    unpruned_tpb, cut_tpb = tokens
    files = speed_run["speed"]["files"]
    lines = [
        "| file | tokens per byte | generation tok/s | gain per token [95%] | ideal | bytes of text/s | gain per byte [95%] | ideal |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    reference = next(iter(files))  # the unpruned file, the speed run's reference
    for name, label in labels.items():
        tg = files[name]["tg"]
        tpb = unpruned_tpb if name == reference else cut_tpb
        row = f"| {label} | {tpb:.4f} | {tg['median']:.1f} | "
        if name == reference:
            lines.append(row + f"| | {tg['median'] / tpb:.1f} | | |")
            continue
        per_byte, ideal = per_byte_gain(tg, unpruned_tpb / tpb)
        lines.append(
            row + f"{gain_text(tg['gain'])} | {100 * tg['ideal']['gain']:+.1f}% | {tg['median'] / tpb:.1f} | {gain_text(per_byte)} | "
            f"{100 * ideal:+.1f}% |"
        )
    return "\n".join(lines)


def per_byte_gain(tg: dict, scale: float) -> tuple[dict, float]:
    """A file's generation gain and its ideal per byte of text; ``scale``: unpruned / cut tokens per byte of text."""
    per_byte = {**tg["gain"], "gain": (1 + tg["gain"]["gain"]) * scale - 1}
    per_byte["gain_interval"] = [(1 + g) * scale - 1 for g in tg["gain"]["gain_interval"]]
    return per_byte, (1 + tg["ideal"]["gain"]) * scale - 1
