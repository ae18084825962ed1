"""Every experiment on the LM task (tiny random Llama with grouped KV heads, synthetic text) in both pruning units."""

from __future__ import annotations

import time

import pytest
import torch
from experiment_helpers import make_cfg, results, speed_settings, task_fixtures

TASK = "lm"
UNITS = ("head", "kv_group")


task, shared_task = task_fixtures(TASK)


def run(tmp_path, experiment: str, *overrides) -> dict:
    """Validate and run ``headprune experiment=<experiment>`` on the tiny LM config; its results.json payload."""
    from hydra.utils import get_method

    from headprune.validation import validate

    cfg = make_cfg(tmp_path, experiment, TASK, *overrides)
    validate(cfg)
    get_method(cfg.run)(cfg)
    return results(tmp_path)["results"]


def test_tiny_llama_shapes(task):
    assert task.gates.groups == {"dec_self": (2, 4)} and task.gates.kv_groups == {"dec_self": (2, 2)}


def test_swapped_model_restores_the_unit_view(task):
    """Speed swaps the pruned model in and back: the task keeps HeadGates, the view keeps KV-group gates."""
    import copy

    from headprune.core.attention.gates import HeadGates
    from headprune.measures.evaluation import swapped_model
    from headprune.tasks.unit_task import in_unit

    kv_task = in_unit(task, "kv_group")
    other = copy.deepcopy(task.model)
    with swapped_model(kv_task, other, HeadGates(other)):
        assert task.model is other and kv_task.gates.unit == "kv_group"
    assert task.gates.unit == "head" and kv_task.gates.heads is task.gates and task.model is not other


def test_kv_group_evaluation_is_its_query_head_mask(task):
    """A KV-group mask evaluates exactly like the query-head mask with all of the group's heads zeroed."""
    from headprune.tasks.unit_task import in_unit

    kv_task = in_unit(task, "kv_group")
    kv_mask = {"dec_self": torch.tensor([[1.0, 0.0], [0.0, 1.0]])}
    heads = {"dec_self": torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])}  # KV head k serves query heads 2k, 2k+1
    assert kv_task.evaluate(kv_mask).per_example == task.evaluate(heads).per_example
    many = kv_task.evaluate_many([kv_mask, None])
    # several masks go through the batched engine: equal up to float rounding
    assert many[0].score == pytest.approx(task.evaluate(heads).score, rel=1e-6)
    assert many[1].score == pytest.approx(task.evaluate(None).score, rel=1e-6)


@pytest.mark.parametrize("unit", UNITS)
def test_ablate(shared_task, tmp_path, unit):
    res = run(tmp_path, "ablate", f"prune.unit={unit}", "ablate.n_samples=50")["splits"]["eval"]
    kv = unit == "kv_group"
    assert res["unit"] == unit and res["units_total"] == (4 if kv else 8) and res["query_heads_total"] == 8
    assert len(res["rows"]) == res["units_total"]
    for row in res["rows"]:  # each unit's ablation equals evaluating its query heads removed
        mask = shared_task.gates.ones()
        heads = [2 * row["head"], 2 * row["head"] + 1] if kv else [row["head"]]
        mask["dec_self"][row["layer"], heads] = 0
        assert row["score"] == pytest.approx(shared_task.evaluate(mask).score, rel=1e-6)  # batched engine: float rounding


@pytest.mark.parametrize("unit", UNITS)
def test_keep_one(shared_task, tmp_path, unit):
    res = run(tmp_path, "keep_one", f"prune.unit={unit}", "keep_one.n_samples=50")
    assert res["unit"] == unit and res["selection_split"] == "importance" and len(res["rows"]) == 2
    assert all(0 <= r["best_head"] < (2 if unit == "kv_group" else 4) for r in res["rows"])


@pytest.mark.parametrize("unit", UNITS)
def test_prune_every_order(shared_task, tmp_path, unit):
    res = run(
        tmp_path,
        "prune",
        f"prune.unit={unit}",
        "prune.fractions=[0,0.5]",
        "prune.n_samples=50",
        "prune.order=[importance,entropy,random,ablation]",
    )
    per_unit = 2 if unit == "kv_group" else 1
    assert res["unit"] == unit and res["units_total"] == 8 // per_unit
    for order in ("importance", "entropy", "random", "ablation"):
        steps = res["orders"][order]["steps"]
        assert [s["units_removed"] for s in steps] == [0, 4 // per_unit]
        assert [s["query_heads_removed"] for s in steps] == [0, 4]
        assert len(steps[1]["mask"]["dec_self"][0]) == 4 // per_unit
    _check_prunable_row(res)


def _check_prunable_row(res):
    """The table's prunable share reads a perplexity rise as the loss: the same as the mirrored higher-is-better curve."""
    from headprune.engine.verdict import prunable_fraction
    from headprune.viz.tables import prune_table

    assert res["higher_is_better"] is False
    for tolerance in (0.0, 1.0, 1e9):
        row = prune_table(res, tolerance=tolerance, unit="perplexity").splitlines()[-1]
        cells = [c.strip() for c in row.strip("|").split("|")[1:]]
        for order, cell in zip(res["orders"], cells):
            steps = res["orders"][order]["steps"]
            mirrored = prunable_fraction([s["fraction"] for s in steps], [-s["score"] for s in steps], tolerance)
            assert cell == f"{100 * mirrored:.0f}%", (order, tolerance)


def test_kv_group_scores_from_the_query_head_gates(task):
    """Importance per KV group = importance_scores(unit=kv_group); entropy per KV group = the mean of its query heads."""
    from omegaconf import OmegaConf

    from headprune.scoring.importance import attention_entropy, importance_scores
    from headprune.sources.orders import ORDERS, OrderSettings
    from headprune.tasks.unit_task import in_unit

    settings = OrderSettings(OmegaConf.create({"reduce": "example", "normalize_layers": True, "normalize_global": False}), 0, None, None)
    kv_task = in_unit(task, "kv_group")
    direct = importance_scores(task.model, task.gates, task.importance_batches(), unit="kv_group")
    assert torch.allclose(ORDERS["importance"].scores(kv_task, settings)["dec_self"], direct["dec_self"])
    entropy = attention_entropy(task.model, task.gates, task.importance_batches())["dec_self"]
    expected = -entropy.view(2, 2, 2).mean(-1)
    assert torch.allclose(ORDERS["entropy"].scores(kv_task, settings)["dec_self"], expected)


@pytest.mark.parametrize("unit", UNITS)
def test_speed_prefill_decode_and_kv_cache(shared_task, tmp_path, unit):
    from headprune.core.counting import kv_cache_bytes_per_token

    res = run(
        tmp_path,
        "speed",
        f"prune.unit={unit}",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=2",
        "speed.warmup=1",
        "speed.max_repeats=2",
        "speed.max_seconds=60",  # a budget a loaded machine does not run out of: two timed rounds, no adaptive ones
    )
    check = res["score_check"]  # removing a whole KV group changes the o_proj sum's length: equal up to float rounding
    assert check["pruned"] == pytest.approx(check["masked"], rel=1e-6) and res["unit"] == unit and res["query_heads_removed"] == 4
    assert [(r["call"], r["unit"]) for r in res["rows"]] == [("prefill", "tokens"), ("decode", "new tokens")]
    decode = res["rows"][1]
    assert decode["original"]["units_per_s"] == pytest.approx(decode["original"]["examples_per_s"] * 4)  # 4 new tokens per text
    assert decode["flop_ideal_gain"] > 0 and decode["seq_len"] == 4
    memory = res["memory"]["kv_cache_bytes_per_token"]
    assert memory["original"] == kv_cache_bytes_per_token(shared_task.model) == 2 * 2 * 2 * 8 * 4  # layers x KV heads x (K, V) x dim x fp32
    assert memory["pruned"] == (memory["original"] // 2 if unit == "kv_group" else memory["original"])


def test_speed_with_uneven_kv_groups(shared_task, tmp_path):
    """One query head pruned leaves its KV head with fewer query heads: the pruned model is timed through the wrapper."""
    res = run(
        tmp_path,
        "speed",
        "speed.fraction=0.125",
        "speed.batch_sizes=[2]",
        "speed.examples=2",
        "speed.repeats=1",
        "speed.warmup=0",
        "speed.max_repeats=2",
        "speed.max_seconds=60",  # not the budget's test: a loaded machine must still time both rows
        "speed.check_score=false",
    )
    assert res["query_heads_removed"] == 1 and len(res["rows"]) == 2
    assert res["memory"]["kv_cache_bytes_per_token"]["saving"] == 0  # the KV head still serves the other query head


def test_speed_rows_of_nli_keep_their_columns():
    """A task with one timed call renders the same speed table as before; several calls add their name and rate."""
    from headprune.viz.tables import speed_rows

    timing = {"examples_per_s": 10.0, "spread": 1.0, "units_per_s": 50.0}
    row = {"batch_size": 1, "original": timing, "pruned": timing, "gain": 0.1, "verdict": "faster", "flop_ideal_gain": 0.2}
    columns, rows = speed_rows({"rows": [{**row, "call": "forward"}]})
    assert columns[0] == "batch_size" and len(rows[0]) == len(columns)
    columns, rows = speed_rows({"rows": [{**row, "call": "prefill", "unit": "tokens"}, {**row, "call": "decode", "unit": "new tokens"}]})
    assert columns[:4] == ["call", "unit", "original_units_s", "pruned_units_s"] and rows[1][:3] == ["decode", "new tokens", 50.0]


def test_score_check_allows_float_rounding_only():
    """Masked and pruned perplexities that differ by float rounding agree; a real difference does not."""
    from headprune.measures.evaluation import score_check
    from headprune.tasks.base import EvalResult

    def result(nll):
        return EvalResult(sum(nll), "perplexity", len(nll), {"nll": nll, "tokens": [10] * len(nll)})

    nll = [30.123456789 + i for i in range(118)]
    rounded = [v * (1 + 3e-9) for v in nll]  # as the o_proj sum of a pruned model rounds
    check = score_check(result(nll), result(rounded))
    assert check["agree"] and not check["equal"] and check["examples_not_identical"] == 118 and check["examples_differing"] == 0
    changed = rounded[:-1] + [rounded[-1] + 0.5]
    assert not score_check(result(nll), result(changed))["agree"]
    tokens = result(nll)
    tokens.per_example["tokens"] = [10] * 117 + [11]  # a discrete record must match exactly
    assert not score_check(result(nll), tokens)["agree"]


def test_speed_refuses_a_pruned_model_that_scores_otherwise(shared_task, monkeypatch):
    """A physically pruned model that does not score like the masked one stops the speed stage before any timing."""
    from headprune.measures import speed_stage as speed

    monkeypatch.setattr(speed, "prune_unit_mask", lambda gates, mask: {})  # "pruning" that removes nothing
    mask = shared_task.gates.ones()
    mask["dec_self"][0, :2] = 0
    with pytest.raises(RuntimeError, match="does not score like the masked one"):
        speed.speed_stage(shared_task, mask, speed_settings(batch_sizes=[2], examples=2, repeats=1, warmup=0), 0)


def test_time_budget_stops_a_long_generation(shared_task, monkeypatch):
    """speed.max_seconds bounds a generation too: cut at the budget, the pass is dropped and the error says what to change."""
    from headprune.engine.timing import TimeBudgetError, compare_throughput

    batches = shared_task.timing_batches(2, 2)
    monkeypatch.setattr(shared_task, "decode_tokens", 120)  # 4 prompt tokens + 120 new ones: within the 128 positions
    calls = {name: shared_task.timed_decode for name in ("original", "pruned")}
    whole = compare_throughput(calls, batches, warmup=0, repeats=1)["original"]["seconds"][0]  # one pass, no budget
    start = time.perf_counter()
    with pytest.raises(TimeBudgetError, match="task.decode_tokens"):
        compare_throughput(calls, batches, warmup=0, repeats=1, max_seconds=whole / 4)  # the generation starts, then stops
    assert time.perf_counter() - start < whole  # well before the pass would have ended


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_gpt2", "tiny_pythia", "tiny_gemma"])
def test_study_on_other_decoder_families(tmp_path, model):
    from headprune.experiments import study

    over = [
        f"model={model}",
        "study.train=false",
        "study.n_samples=50",
        "prune.step=0.5",
        "prune.order=[importance,random]",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=1",
        "speed.warmup=1",
    ]
    study.run(make_cfg(tmp_path, "study", TASK, *over))
    payload = results(tmp_path)
    assert {"ablate", "keep_one", "prune", "speed"} <= set(payload["results"]), sorted(payload["results"])
    assert payload["config"]["model"]["name"] == model
