"""Verdicts on measured numbers (torch-free, for tables too): is a speed gain real, how far pruning can go."""

import math
import statistics


def gain_summary(original_seconds: list[float], pruned_seconds: list[float]) -> dict:
    """The pruned model's throughput gain from paired repeats: mean original time / mean pruned time - 1, with a 95% interval."""
    n = min(len(original_seconds), len(pruned_seconds))
    if n == 0:
        raise ValueError("no timed repeats to compare: both models need at least one timed pass")
    original, pruned = list(original_seconds[:n]), list(pruned_seconds[:n])
    ratio = statistics.fmean(original) / statistics.fmean(pruned)
    if n < 2:
        return {"gain": ratio - 1, "gain_interval": None, "gain_spread": None, "repeats": n}  # no interval from one repeat
    from scipy.stats import t

    # delta method on the paired residuals d_i = t_o[i] - R t_p[i]: se(R) = sd(d) / (sqrt(n) mean(t_p)), Student's t on n - 1 dof
    residuals = [o - ratio * p for o, p in zip(original, pruned)]  # sum to 0 by the choice of R
    se = statistics.stdev(residuals) / (math.sqrt(n) * statistics.fmean(pruned))
    half = float(t.ppf(0.975, n - 1)) * se
    spread = statistics.stdev([o / p - 1 for o, p in zip(original, pruned)])
    return {"gain": ratio - 1, "gain_interval": [ratio - 1 - half, ratio - 1 + half], "gain_spread": spread, "repeats": n}


def verdict(summary: dict) -> str:
    """``inconclusive`` when the gain's interval includes zero or its spread exceeds it, else ``confident``."""
    if summary["gain_interval"] is None:
        return "inconclusive"
    low, high = summary["gain_interval"]
    return "inconclusive" if low <= 0.0 <= high or summary["gain_spread"] > abs(summary["gain"]) else "confident"


def beyond_ideal(summary: dict, ideal: float) -> bool:
    """True when a measured gain exceeds its ideal (FLOP or bandwidth) by more than its 95% interval: a measurement to explain."""
    interval = summary.get("gain_interval")
    return interval is not None and interval[0] > ideal


NOT_TIMED = "not timed: ran out of speed.max_seconds on this machine"  # a measurement the time budget cut before one pass


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


def prunable_fraction(fractions, scores, tolerance: float = 1.0, higher_is_better: bool = True) -> float:
    """The largest fraction up to which every step loses at most ``tolerance`` (in the metric's unit) against the first."""
    best = 0.0
    for fraction, score in zip(fractions, scores):
        loss = scores[0] - score if higher_is_better else score - scores[0]  # perplexity: a rise is the loss
        if loss > tolerance:
            break
        best = fraction
    return best
