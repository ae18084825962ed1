"""docs/results_long_context.md's cells: n and intervals beside each score, paired tests only where orders can be judged."""

import math

from long_context_cells import cells_table, curve_table, paired_rows, paired_table, perplexity_paired_table, perplexity_rows


def _run(base: list[int], steps: dict[str, list[int]], fraction: float = 0.75) -> dict:
    """A streaming passkey run of len(base) prompts: the unpruned 0/1 per prompt and one step per order."""
    score = lambda c: 100.0 * sum(c) / len(c)  # noqa: E731
    return {
        "base_score": score(base),
        "n_examples": len(base),
        "base_per_example": {"correct": base},
        "orders": {
            o: {"steps": [{"fraction": fraction, "score": score(c), "kv_fraction": 0.5, "per_example": {"correct": c}}]}
            for o, c in steps.items()
        },
    }


def _ppl_run(base_nll: list[float], steps: dict[str, list[float]], tokens: int = 1000) -> dict:
    ppl = lambda nll: math.exp(sum(nll) / (tokens * len(nll)))  # noqa: E731
    example = lambda nll: {"nll": nll, "tokens": [tokens] * len(nll)}  # noqa: E731
    return {
        "base_score": ppl(base_nll),
        "n_examples": len(base_nll),
        "base_per_example": example(base_nll),
        "orders": {
            o: {"steps": [{"fraction": 0.75, "score": ppl(n), "kv_fraction": 0.5, "per_example": example(n)}]} for o, n in steps.items()
        },
    }


def test_an_order_against_random_counts_the_discordant_prompts_and_judges_after_bonferroni():
    """100 prompts, the unpruned model right on 90: duo alone retrieves 18 prompts random misses, random alone 2."""
    base = [1] * 90 + [0] * 10
    duo = [1] * 60 + [0] * 40
    random = [1] * 42 + [0] * 18 + [1] * 2 + [0] * 38  # shares duo's first 42, misses 18 of duo's, finds 2 duo misses
    passkey = {1024: _run(base, {"duo": duo, "random": random})}
    nll = [3000.0 + 10 * i for i in range(20)]
    ppl = {1024: _ppl_run(nll, {"duo": [v + 5 for v in nll], "random": [v + 40 + (i % 3) for i, v in enumerate(nll)]})}
    (row,) = paired_rows(passkey, ppl)
    assert (row["mcnemar"]["first_only"], row["mcnemar"]["second_only"]) == (18, 2)
    expected_p = 2 * sum(math.comb(20, i) for i in range(3)) / 2**20
    assert math.isclose(row["mcnemar"]["p_value"], expected_p, rel_tol=1e-9)
    ratio = row["perplexity_ratio"]
    assert ratio[1] < ratio[0] < ratio[2] < 1.0  # duo below random on every document
    line = paired_table(passkey, ppl).splitlines()[2]
    assert "| 1,024 | 75% | duo | random | 18 / 2 |" in line and "| better |" in line


def test_without_random_an_order_is_tested_against_the_unpruned_model():
    base = [1] * 90 + [0] * 10
    duo = [1] * 85 + [0] * 5 + [1] * 2 + [0] * 8  # loses 5 prompts the unpruned model retrieves, finds 2 it misses
    nll = [3000.0 + 10 * i for i in range(20)]
    ppl = {1024: _ppl_run(nll, {"duo": [v + 30 for v in nll]})}
    (row,) = paired_rows({1024: _run(base, {"duo": duo})}, ppl)
    assert row["against"] == "unpruned" and (row["mcnemar"]["first_only"], row["mcnemar"]["second_only"]) == (2, 5)
    assert math.isclose(row["perplexity_ratio"][0], math.exp(30 / 1000), rel_tol=1e-12)


def test_no_order_is_judged_where_the_unpruned_model_mostly_fails():
    base = [1] * 42 + [0] * 58
    passkey = {2048: _run(base, {"duo": base, "random": [0] * 100})}
    (row,) = paired_rows(passkey, {})
    assert row["not_judged"].startswith("no order can be judged at 2,048 tokens: the unpruned model retrieves 42 [33, 52] (%)")
    assert "of 100 prompts" in paired_table(passkey, {})


def test_cells_carry_their_sample_and_interval():
    passkey = {1024: _run([1] * 83 + [0] * 17, {"duo": [1] * 80 + [0] * 20})}
    rows = cells_table(passkey, "passkey").splitlines()
    assert rows[2] == "| 1,024 | 100 | 0% | 100% | 83 [74, 89] |" and rows[3].startswith("| 1,024 | 100 | 75% | 50% | 80 [71, 87]")
    ppl = _ppl_run([3000.0, 3100.0, 2900.0], {"duo": [3050.0, 3150.0, 2950.0]})
    row = cells_table({1024: ppl}, "perplexity").splitlines()[2]
    assert row.startswith("| 1,024 | 3 | 0% | 100% | 20.09 [") and row.count("[") == 1
    old = {1024: {**ppl, "base_per_example": None}}
    assert cells_table(old, "perplexity").splitlines()[2] == "| 1,024 | 3 | 0% | 100% | 20.09 |"


def test_the_curve_lists_every_measurement_of_the_unpruned_model_with_its_sample():
    curve = {"lengths": {"2048": {"n": 100, "score": 41.0}}}
    sources = {"cells": {1024: _run([1] * 85 + [0] * 15, {"duo": [1] * 100})}, "first": {1024: _run([1] * 10 + [0] * 2, {})}}
    table = curve_table(curve, sources).splitlines()
    assert table[2] == "| 1,024 | 100 | 85 [77, 91] | yes | cells |"
    assert table[3] == "| 1,024 | 12 | 83 [55, 95] | yes | first |"
    assert table[4] == "| 2,048 | 100 | 41 [32, 51] | no (below 80%) | tools/passkey_curve.py |"
    assert len(curve_table(None, {"first": sources["first"]}).splitlines()) == 3


def test_perplexity_is_compared_on_the_same_documents_at_every_length():
    """duo's documents one nat above or below random's in turn, importance's about 25 above: only the latter is called higher."""
    nll = [3000.0 + 10 * i for i in range(20)]
    random = [v + 5 + (i % 3) for i, v in enumerate(nll)]
    steps = {
        "duo": [v + (1 if i % 2 else -1) for i, v in enumerate(random)],
        "importance": [v + 25 + (i % 4) for i, v in enumerate(random)],
        "random": random,
    }
    ppl = {4096: _ppl_run(nll, steps)}
    rows = {row["order"]: row for row in perplexity_rows(ppl)}
    assert set(rows) == {"duo", "importance"} and all(row["against"] == "random" for row in rows.values())
    expected = math.exp(sum(b - a for a, b in zip(steps["random"], steps["importance"])) / (1000 * 20))
    assert math.isclose(rows["importance"]["ratio"][0], expected, rel_tol=1e-9)
    lines = perplexity_paired_table(ppl).splitlines()
    assert any(line.startswith("| 4,096 | 20 | 75% | importance | random |") and line.endswith("| higher |") for line in lines)
    assert any("| duo |" in line and line.endswith("| no difference shown |") for line in lines)


def test_parts_of_other_fractions_merge_and_a_passkey_only_table_drops_perplexity():
    """Two runs of the same prompts at 50% and 75% streamed are one curve per order; without perplexity runs the paired
    table has no perplexity column."""
    from long_context_tables import merged

    base = [1] * 90 + [0] * 10
    half = _run(base, {"duo": [1] * 88 + [0] * 12, "random": [1] * 80 + [0] * 20}, fraction=0.5)
    most = _run(base, {"duo": [1] * 85 + [0] * 15, "random": [1] * 60 + [0] * 40})
    run = merged([most, half])
    assert [s["fraction"] for s in run["orders"]["duo"]["steps"]] == [0.5, 0.75]
    assert merged([half, most]) == run
    table = paired_table({1024: run}, {}).splitlines()
    assert "perplexity" not in table[0] and all(line.count("|") == 8 for line in table)
    assert [line.split(" | ")[1] for line in table[2:]] == ["50%", "75%"]
