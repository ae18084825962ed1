"""Is a measured speed gain real? Paired repeats, a 95% interval, and a verdict (torch-free, for tables too).

A gain whose interval includes zero, or whose repeat-to-repeat spread exceeds it, is
``inconclusive``: tables and figures show that word instead of a number.
"""

from __future__ import annotations

import math
import os
import statistics


def gain_summary(original_seconds: list[float], pruned_seconds: list[float]) -> dict:
    """The pruned model's throughput gain from paired repeats: mean, spread (std) and Student-t 95% interval.

    Repeat i timed both models on the same batches back to back, so its gain is
    t_original[i] / t_pruned[i] - 1; pairing cancels load that hits both alike.
    """
    gains = [o / p - 1 for o, p in zip(original_seconds, pruned_seconds)]
    n = len(gains)
    mean = statistics.fmean(gains) if gains else 0.0
    if n < 2:
        return {"gain": mean, "gain_interval": None, "gain_spread": None, "repeats": n}  # no interval from one repeat
    from scipy.stats import t

    spread = statistics.stdev(gains)
    half = float(t.ppf(0.975, n - 1)) * spread / math.sqrt(n)  # 95% interval of the mean gain
    return {"gain": mean, "gain_interval": [mean - half, mean + half], "gain_spread": spread, "repeats": n}


def verdict(summary: dict) -> str:
    """``inconclusive`` when the gain's interval includes zero or its spread exceeds it, else ``confident``."""
    if summary["gain_interval"] is None:
        return "inconclusive"
    low, high = summary["gain_interval"]
    if low <= 0.0 <= high or summary["gain_spread"] > abs(summary["gain"]):
        return "inconclusive"
    return "confident"


def is_inconclusive(row: dict) -> bool:
    """True for a timing row whose verdict is inconclusive (rows from before verdicts count as numbers)."""
    return row.get("verdict") == "inconclusive"


def gain_text(row: dict) -> str:
    """``+12.3% [+8.1, +16.5]`` or ``inconclusive (-3.0% [-20.1, +14.2], spread 25.0%)``."""
    gain, interval, spread = row["gain"], row.get("gain_interval"), row.get("gain_spread")
    bounds = f" [{100 * interval[0]:+.1f}, {100 * interval[1]:+.1f}]" if interval else ""
    if is_inconclusive(row):
        noise = f", spread {100 * spread:.1f}%" if spread is not None else ", one repeat"
        return f"inconclusive ({100 * gain:+.1f}%{bounds}{noise})"
    return f"{100 * gain:+.1f}%{bounds}"


def load_average() -> list[float] | None:
    """The machine's 1, 5 and 15 minute load averages (None where the OS has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (AttributeError, OSError):
        return None
