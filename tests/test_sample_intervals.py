"""Intervals and paired tests of sampled scores, against hand computations without scipy."""

import math

import pytest

from headprune.scoring.sample_intervals import (
    mcnemar_exact,
    paired_perplexity_ratio,
    perplexity_interval,
    ratio_interval,
    wilson_interval,
)

Z95 = 1.959963984540054  # the normal's 97.5% quantile
T95_4DF = 2.7764451051977987  # Student's t 97.5% quantile, 4 degrees of freedom


@pytest.mark.parametrize("k,n", [(0, 10), (3, 12), (50, 100), (83, 100), (100, 100), (1, 263), (81, 263)])
def test_wilson_interval_is_the_roots_of_the_score_quadratic(k, n):
    """The bounds solve (n + z^2) p^2 - (2k + z^2) p + k^2 / n = 0: the p where the score statistic equals z."""
    a, b, c = n + Z95**2, -(2 * k + Z95**2), k * k / n
    root = math.sqrt(b * b - 4 * a * c)
    low, high = wilson_interval(k, n)
    assert low == pytest.approx(max(0.0, (-b - root) / (2 * a)), abs=1e-9)
    assert high == pytest.approx(min(1.0, (-b + root) / (2 * a)), abs=1e-9)
    assert low <= k / n <= high


def test_wilson_interval_refuses_impossible_counts():
    with pytest.raises(ValueError, match="at least one example"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match=r"successes must lie in \[0, n=5\]"):
        wilson_interval(6, 5)


def _binomial_two_sided(b: int, c: int) -> float:
    """Twice the smaller tail of Binomial(b + c, 1/2), capped at 1 (the exact McNemar p-value)."""
    n = b + c
    tail = sum(math.comb(n, i) for i in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)


@pytest.mark.parametrize("b,c,same", [(12, 3, 40), (5, 5, 10), (0, 7, 3), (1, 0, 0), (20, 9, 71)])
def test_mcnemar_exact_counts_the_discordant_pairs_and_matches_the_binomial_tail(b, c, same):
    first = [1] * b + [0] * c + [1] * (same // 2) + [0] * (same - same // 2)
    second = [0] * b + [1] * c + [1] * (same // 2) + [0] * (same - same // 2)
    got = mcnemar_exact(first, second)
    assert (got["first_only"], got["second_only"]) == (b, c)
    assert got["p_value"] == pytest.approx(_binomial_two_sided(b, c), rel=1e-9)


def test_mcnemar_exact_without_discordant_pairs_and_with_unpaired_outcomes():
    assert mcnemar_exact([1, 0, 1], [1, 0, 1]) == {"first_only": 0, "second_only": 0, "p_value": 1.0}
    with pytest.raises(ValueError, match="same examples: 3 vs 2"):
        mcnemar_exact([1, 0, 1], [1, 0])


def test_ratio_interval_with_equal_denominators_is_the_t_interval_of_the_means():
    """Documents of one length: the corpus ratio is the mean of the per-document ratios, its interval Student's t."""
    nll = [3.1, 2.7, 3.4, 2.9, 3.6]
    tokens = [1000] * 5
    per_doc = [x / 1000 for x in nll]
    mean = sum(per_doc) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in per_doc) / 4)
    got = ratio_interval(nll, tokens)
    expected = (mean, mean - T95_4DF * sd / math.sqrt(5), mean + T95_4DF * sd / math.sqrt(5))
    assert got == pytest.approx(expected, rel=1e-9)
    ppl = perplexity_interval(nll, tokens)
    assert ppl == pytest.approx(tuple(math.exp(v) for v in expected), rel=1e-9)


def test_paired_perplexity_ratio_swapped_is_its_reciprocal_and_one_for_the_same_system():
    nll, other, tokens = [3000.0, 2600.0, 3500.0, 2800.0], [3100.0, 2650.0, 3480.0, 2950.0], [1000, 900, 1100, 1000]
    ratio, low, high = paired_perplexity_ratio(nll, other, tokens)
    back = paired_perplexity_ratio(other, nll, tokens)
    assert back == pytest.approx((1 / ratio, 1 / high, 1 / low), rel=1e-9)
    assert ratio == pytest.approx(math.exp((sum(nll) - sum(other)) / sum(tokens)), rel=1e-12)
    assert low < ratio < high
    with pytest.raises(ValueError, match="same documents: 4 vs 3"):
        paired_perplexity_ratio(nll, other[:3], tokens)
