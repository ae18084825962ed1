"""Intervals and paired tests of a score measured on a sample (torch-free, for tables too)."""

import math
import statistics


def _z(confidence: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


def wilson_interval(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson's score interval of a proportion (as fractions): the p with |k/n - p| <= z sqrt(p (1 - p) / n)."""
    if n <= 0:
        raise ValueError("a proportion needs at least one example")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, n={n}], got {successes}")
    z, p = _z(confidence), successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_exact(first: list[int], second: list[int]) -> dict:
    """McNemar's exact test: two-sided p of b ``first_only`` under Binomial(b + c, 1/2), c ``second_only`` (1 with none discordant)."""
    if len(first) != len(second):
        raise ValueError(f"paired outcomes need the same examples: {len(first)} vs {len(second)}")
    b = sum(1 for x, y in zip(first, second) if x and not y)
    c = sum(1 for x, y in zip(first, second) if y and not x)
    if b + c == 0:
        return {"first_only": 0, "second_only": 0, "p_value": 1.0}
    from scipy.stats import binomtest

    return {"first_only": b, "second_only": c, "p_value": float(binomtest(b, b + c, 0.5).pvalue)}


def ratio_interval(numerators: list[float], denominators: list[float], confidence: float = 0.95) -> tuple[float, float, float]:
    """R = sum(num) / sum(den) over items with its t interval: se = sd(num_i - R den_i) / (sqrt(n) mean(den)), n - 1 df."""
    n = len(numerators)
    if n != len(denominators) or n < 2:
        raise ValueError(f"a ratio interval needs two or more paired items, got {n} and {len(denominators)}")
    from scipy.stats import t

    ratio = sum(numerators) / sum(denominators)
    se = statistics.stdev([a - ratio * d for a, d in zip(numerators, denominators)]) / (math.sqrt(n) * statistics.fmean(denominators))
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * se
    return ratio, ratio - half, ratio + half


def perplexity_interval(nll: list[float], tokens: list[int], confidence: float = 0.95) -> tuple[float, float, float]:
    """Corpus perplexity over documents (NLL sums, tokens) with its interval: exp of ``ratio_interval``."""
    return tuple(math.exp(value) for value in ratio_interval(nll, tokens, confidence))


def paired_perplexity_ratio(nll: list[float], other_nll: list[float], tokens: list[int], confidence: float = 0.95) -> tuple:
    """Perplexity of one system over another's on the same documents (exp of the mean NLL difference per token) with its interval."""
    if len(nll) != len(other_nll):
        raise ValueError(f"paired perplexities need the same documents: {len(nll)} vs {len(other_nll)}")
    return tuple(math.exp(value) for value in ratio_interval([a - b for a, b in zip(nll, other_nll)], tokens, confidence))
