"""Two models on the same items: the accuracy difference and the perplexity ratio, with paired intervals (torch-free)."""

import math
import statistics

from headprune.scoring.sample_intervals import _z, mcnemar_exact, paired_perplexity_ratio


def paired_accuracy_difference(first: list[int], second: list[int], confidence: float = 0.95) -> dict:
    """Accuracy of ``first`` minus ``second`` (0/1 per item, same items): the mean per-item difference with its normal
    interval (mean +- z sd / sqrt(n)) and McNemar's exact test (first_only, second_only, p_value)."""
    n = len(first)
    if n != len(second) or n < 2:
        raise ValueError(f"a paired difference needs two or more items scored by both models, got {n} and {len(second)}")
    diffs = [a - b for a, b in zip(first, second)]
    mean = statistics.fmean(diffs)
    half = _z(confidence) * statistics.stdev(diffs) / math.sqrt(n)
    return {"items": n, "difference": mean, "low": mean - half, "high": mean + half, **mcnemar_exact(first, second)}


def bootstrap_perplexity_ratio(
    loglikelihood: list[float], other: list[float], words: list[int], draws: int = 2000, seed: int = 0, confidence: float = 0.95
) -> dict:
    """Word perplexity of one model over another's on the same documents, exp(sum(other - loglikelihood) / sum(words)),
    with a percentile bootstrap over documents (``draws`` resamples, seeded) and the ratio estimator's t interval."""
    import numpy as np

    n = len(words)
    if not n == len(loglikelihood) == len(other) or n < 2:
        raise ValueError(f"a perplexity ratio needs two or more documents: got {len(loglikelihood)}, {len(other)} scores, {n} word counts")
    gap = np.asarray(other, dtype=np.float64) - np.asarray(loglikelihood, dtype=np.float64)  # NLL of the first minus the other's
    count = np.asarray(words, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, n, size=(draws, n))  # (draws, documents)
    ratios = np.exp(gap[picks].sum(1) / count[picks].sum(1))
    tail = (1 - confidence) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    _, t_low, t_high = paired_perplexity_ratio([-x for x in loglikelihood], [-x for x in other], list(words), confidence)
    ratio = math.exp(float(gap.sum() / count.sum()))
    bootstrap = {"low": float(low), "high": float(high), "draws": draws, "seed": seed}
    return {"documents": n, "ratio": ratio, **bootstrap, "t_low": t_low, "t_high": t_high}


def point_perplexity_ratio(point: dict, other: dict) -> dict | None:
    """A results point's perplexity over another's on the same texts, with its paired bootstrap interval over them
    (``bootstrap_perplexity_ratio`` of their ``per_example`` NLL); None where the two scored other tokens (another tokenizer)."""
    tokens = other["per_example"]["tokens"]
    if tokens != point["per_example"]["tokens"]:
        return None
    return bootstrap_perplexity_ratio([-x for x in point["per_example"]["nll"]], [-x for x in other["per_example"]["nll"]], tokens)
