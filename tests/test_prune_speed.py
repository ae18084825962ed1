"""Pruning for speed through the prune experiment and the study: fisher order, targets, recovery, schedule, Pareto rows."""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from experiment_helpers import NLI, make_cfg, results, task_fixtures

from headprune.experiments import prune, study

TASK = "nli"
task, shared_task = task_fixtures(TASK)
QUICK_FINETUNE = ["prune.finetune.max_steps=2", "prune.recover_examples=32"]
QUICK_TIMING = [  # one timed pass of 4 examples per model, no time budget
    "prune.measure_speed=true",
    "speed.batch_sizes=[2]",
    "speed.examples=4",
    "speed.repeats=1",
    "speed.warmup=1",
    "speed.max_seconds=0",
]


def points_of(tmp_path) -> list[dict]:
    payload = results(tmp_path)
    assert "pareto.png" in payload["figures"]
    return payload["results"]["points"]


def test_fisher_order_is_the_fisher_of_the_gates(shared_task):
    from headprune.scoring.importance import fisher_scores
    from headprune.sources.orders import ORDERS, OrderSettings

    settings = OrderSettings(importance=None, seed=0, ablation_split=None, n_samples=None)
    direct = fisher_scores(shared_task.model, shared_task.gates, shared_task.importance_batches())
    ordered = ORDERS["fisher"].scores(shared_task, settings)
    assert ORDERS["fisher"].reestimable
    for group in direct:
        assert torch.allclose(direct[group], ordered[group], rtol=1e-5, atol=1e-12)
    mask = {g: torch.ones_like(s) for g, s in direct.items()}
    mask["enc_self"][0, 1] = 0
    again = ORDERS["fisher"].scores(shared_task, settings, mask=mask)
    assert float(again["enc_self"][0, 1]) == 0.0


def test_speedup_target_for_two_orders_and_two_recoveries(shared_task, tmp_path):
    from headprune.viz.tables import pareto_rows, pareto_table

    cfg = make_cfg(tmp_path, "prune", TASK, "prune.order=[importance,fisher]", "prune.target={speedup:1.05}", "prune.recover=[none,lsq]")
    prune.run(cfg)
    points = points_of(tmp_path)
    assert [(p["order"], p["recovery"]) for p in points] == [
        ("unpruned", "none"),
        ("importance", "none"),
        ("importance", "lsq"),
        ("fisher", "none"),
        ("fisher", "lsq"),
    ]
    for p in points[1:]:
        assert p["predicted_speedup"] >= 1.05 and p["target"] == {"speedup": 1.05} and p["units_removed"] > 0
        assert 0 < p["flops_kept"] < 1 and p["score"] is not None and p["mask"]
    columns, rows = pareto_rows(results(tmp_path))
    assert len(rows) == 5 and rows[0][columns.index("method")] == "unpruned" and rows[4][0] == "fisher+lsq"
    table = pareto_table(results(tmp_path))
    assert "fisher+lsq" in table and "speedup=1.05" in table and "Pareto" in table


def test_lsq_recovery_in_the_experiment_equals_the_physically_pruned_model(shared_task, tmp_path):
    from headprune.core.pruning import prune_mask
    from headprune.selection.uniform import layout_masks
    from headprune.stages.calibration_batches import recovery_batches
    from headprune.stages.pareto_measure import recovered_model

    cfg = make_cfg(tmp_path, "prune", TASK, "prune.recover=lsq")
    scores = {g: torch.rand(l, h, generator=torch.Generator().manual_seed(1)) for g, (l, h) in shared_task.gates.groups.items()}
    mask = layout_masks(scores, shared_task.gates.groups, [0.5])[0]
    batches = recovery_batches(shared_task, 32)
    assert sum(b["input_ids"].shape[0] for b in batches) == 32
    before = {k: v.clone() for k, v in shared_task.model.state_dict().items()}
    model, gates, evaluate_mask, _ = recovered_model(shared_task, mask, "lsq", cfg.prune, batches, None, False, "recover")
    assert all(torch.equal(before[k], v) for k, v in shared_task.model.state_dict().items())  # the task's model is untouched
    pruned = copy.deepcopy(model)
    prune_mask(pruned, evaluate_mask)
    inputs = {k: v for k, v in batches[0].items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    with torch.no_grad(), gates.masked(evaluate_mask):
        masked_logits = model(**inputs).logits
    with torch.no_grad():
        pruned_logits = pruned(**inputs).logits
    assert torch.allclose(masked_logits, pruned_logits, atol=1e-5)
    with torch.no_grad(), shared_task.gates.masked(mask):
        plain_logits = shared_task.model(**inputs).logits
    assert not torch.allclose(masked_logits, plain_logits, atol=1e-5)  # the scales did something


def test_flops_target_with_finetune_recovery(shared_task, tmp_path):
    cfg = make_cfg(tmp_path, "prune", TASK, "prune.order=fisher", "prune.target={flops:0.9}", "prune.recover=finetune", *QUICK_FINETUNE)
    prune.run(cfg)
    points = points_of(tmp_path)
    assert [p["recovery"] for p in points] == ["none", "finetune"]
    assert points[1]["flops_kept"] <= 0.9 + 1e-9


def test_finetune_recovery_trains_on_the_training_split_and_logs_every_step(shared_task, tmp_path, monkeypatch):
    """prune.finetune.examples draws training examples (not the importance subset); the losses land in results and the logger."""
    drawn = []
    original = type(shared_task).training_batches

    def spy(self, examples, seed=0):
        drawn.append((examples, seed))
        return original(self, examples, seed)

    monkeypatch.setattr(type(shared_task), "training_batches", spy)
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.order=fisher",
        "prune.fractions=0.25",
        "prune.recover=finetune",
        "logger=csv",
        "prune.finetune.max_steps=3",
        "prune.finetune.examples=40",
        "prune.finetune.decay=true",
        "prune.finetune.warmup=0.3",
    )
    prune.run(cfg)
    points = points_of(tmp_path)
    assert drawn == [(40, 0)]
    assert [p["recovery"] for p in points] == ["none", "finetune"] and len(points[1]["finetune_losses"]) == 3
    assert results(tmp_path)["results"]["finetune"]["examples"] == 40
    logged = (tmp_path / "csv").rglob("metrics.csv")
    assert any("recover/fisher/25%/loss" in path.read_text() for path in logged)


def test_a_schedule_fine_tunes_each_round_on_a_new_draw(shared_task, tmp_path, monkeypatch):
    drawn = []
    original = type(shared_task).training_batches
    monkeypatch.setattr(type(shared_task), "training_batches", lambda self, n, seed=0: drawn.append(seed) or original(self, n, seed))
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.order=fisher",
        "prune.schedule=[0.25,0.5]",
        "prune.recover=finetune",
        "prune.finetune.max_steps=2",
        "prune.finetune.examples=16",
        "prune.finetune.seed=5",
    )
    prune.run(cfg)
    assert drawn == [5, 6]
    assert [p["step"] for p in points_of(tmp_path)] == ["0%", "25%", "50%"]


def test_recovered_points_are_timed_on_their_recovered_models(shared_task, tmp_path, monkeypatch):
    """Generation speed depends on the weights: a recovered point is timed on its own recovered, physically pruned model."""
    from headprune.core.pruning import pruning_record
    from headprune.stages import pareto_measure as speed_experiment

    timed = []
    original = speed_experiment.speed_stage

    def spy(*args, pruned_model=None, **kwargs):
        timed.append(None if pruned_model is None else len(pruning_record(pruned_model)))
        return original(*args, pruned_model=pruned_model, **kwargs)

    monkeypatch.setattr(speed_experiment, "speed_stage", spy)
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.order=fisher",
        "prune.fractions=0.25",
        "prune.recover=[none,lsq,finetune]",
        "prune.finetune.max_steps=1",
        "prune.recover_examples=16",
        *QUICK_TIMING,
    )
    prune.run(cfg)
    points = points_of(tmp_path)
    assert timed[0] is None and all(n for n in timed[1:]) and len(timed) == 3
    assert [p["measured"]["model"] for p in points[1:]] == ["pruned by the mask", "recovered", "recovered"]


def test_a_speed_budget_that_runs_out_keeps_the_recovered_scores(shared_task, tmp_path, monkeypatch):
    """Hours of recovery are not lost to speed.max_seconds: the point that could not be timed is written without timing."""
    from headprune.engine.timing import TimeBudgetError
    from headprune.stages import pareto_measure as speed_experiment

    original = speed_experiment.speed_stage

    def budget_runs_out_on_recovered_models(*args, pruned_model=None, **kwargs):
        if pruned_model is not None:
            raise TimeBudgetError("speed.max_seconds=1 ran out before one timed pass of every model")
        return original(*args, pruned_model=pruned_model, **kwargs)

    monkeypatch.setattr(speed_experiment, "speed_stage", budget_runs_out_on_recovered_models)
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.order=fisher",
        "prune.fractions=0.25",
        "prune.recover=[none,finetune]",
        "prune.finetune.max_steps=1",
        *QUICK_TIMING,
    )
    prune.run(cfg)
    points = {p["recovery"]: p for p in points_of(tmp_path)[1:]}
    assert "measured" in points["none"] and "measured" not in points["finetune"]
    assert 0.0 <= points["finetune"]["score"] <= 100.0


def test_measured_speed_alone_gives_pareto_points(shared_task, tmp_path):
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.order=importance",
        "prune.fractions=0.25",
        *QUICK_TIMING,
    )
    prune.run(cfg)
    points = points_of(tmp_path)
    assert [p["order"] for p in points] == ["unpruned", "importance"] and all("measured" in p for p in points)


def test_training_batches_are_seeded_draws_of_the_training_split(shared_task):
    first, again, other = (shared_task.training_batches(20, seed=s) for s in (0, 0, 1))
    assert sum(len(b["labels"]) for b in first) == 20
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, again))
    assert not all(
        a["input_ids"].shape == b["input_ids"].shape and torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, other)
    )
    assert "idx" not in first[0]
    shared_task.per_example_loss(first[0])  # model inputs the task's loss accepts


def test_max_drop_target_is_chosen_on_the_selection_split(shared_task, tmp_path, monkeypatch):
    seen = []
    evaluate = type(shared_task).evaluate

    def spy(self, mask=None, split="eval", **kwargs):
        seen.append(split)
        return evaluate(self, mask, split, **kwargs)

    monkeypatch.setattr(type(shared_task), "evaluate", spy)
    cfg = make_cfg(tmp_path, "prune", TASK, "prune.order=fisher", "prune.target={max_drop:100.0}")
    prune.run(cfg)
    points = points_of(tmp_path)
    assert results(tmp_path)["results"]["selection_split"] == "importance"
    assert (
        "importance" in seen and points[1]["units_removed"] == shared_task.gates.num_heads - 2
    )  # all may go but the last head per layer (it saves nothing)


def test_schedule_prunes_recovers_and_prunes_more(shared_task, tmp_path):
    cfg = make_cfg(
        tmp_path, "prune", TASK, "prune.order=fisher", "prune.schedule=[0.25,0.5]", "prune.recover=lsq", "prune.recover_examples=32"
    )
    prune.run(cfg)
    points = points_of(tmp_path)
    assert [(p["step"], p["units_removed"]) for p in points] == [("0%", 0), ("25%", 2), ("50%", 4)]
    first, second = (torch.tensor(points[i]["mask"]["enc_self"]) for i in (1, 2))
    assert bool(((first == 0) <= (second == 0)).all())  # each step removes more, never brings a head back


def test_latency_cost_is_cached_in_the_run_dir_and_speed_is_measured(shared_task, tmp_path, monkeypatch):
    from headprune.selection import latency
    from headprune.selection.costs import CostModel

    def steady_tables(model, inputs, unit="head", device="cpu", **kwargs):  # a tiny model's timings are noise: a fixed seconds table
        return CostModel("seconds", 1.0, {"enc_self": torch.arange(5.0).clamp(min=1).repeat(2, 1) / 10})

    monkeypatch.setattr(latency, "measure_unit_latency_model", steady_tables)
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.target={speedup:1.05}",
        "prune.cost=latency",
        "prune.seq_len=16",
        "prune.measure_speed=true",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=2",
        "speed.max_repeats=2",
        "speed.warmup=1",
        "speed.max_seconds=5",
    )
    prune.run(cfg)
    points = points_of(tmp_path)
    assert list((tmp_path / "latency").glob("latency-*.json"))
    assert points[1]["cost_unit"] == "seconds" and points[1]["predicted_speedup"] >= 1.05
    assert all(p["measured"]["examples_per_s"] > 0 for p in points) and points[0]["measured"]["speedup"] == 1.0


def test_pareto_front_marks_undominated_points():
    from headprune.viz.tables import pareto_front

    points = [
        {"score": 80, "predicted_speedup": 1.0},
        {"score": 79, "predicted_speedup": 1.3},
        {"score": 78, "predicted_speedup": 1.2},
        {"score": 70, "predicted_speedup": 1.3, "measured": {"speedup": 1.5}},
    ]
    assert pareto_front(points) == [True, True, False, True]
    assert pareto_front(points, higher_is_better=False) == [False, False, False, True]


def test_pareto_runs_merge_into_one_table_with_one_unpruned_row():
    from headprune.viz.tables import merged_pareto, pareto_table

    def run(order, score):
        unpruned = {
            "order": "unpruned",
            "recovery": "none",
            "step": "0%",
            "units_removed": 0,
            "units_total": 4,
            "score": 80.0,
            "predicted_speedup": 1.0,
            "flops_kept": 1.0,
        }
        point = {**unpruned, "order": order, "step": "50%", "units_removed": 2, "score": score, "predicted_speedup": 1.2, "flops_kept": 0.8}
        return {
            "results": {
                "metric": "accuracy",
                "split": "eval",
                "n_examples": 10,
                "base_score": 80.0,
                "cost": "flops",
                "selection_split": "importance",
                "points": [unpruned, point],
            }
        }

    timed = run("fisher", 70.0)
    timed["results"]["points"][1].update(mask={"enc_self": [[1, 0]]}, measured={"speedup": 1.3, "examples_per_s": 13.0})
    untimed = run("fisher", 79.0)
    untimed["results"]["points"][1].update(mask={"enc_self": [[1, 0]]}, recovery="lsq")
    merged = merged_pareto(timed, untimed)
    assert [p["order"] for p in merged["points"]] == ["unpruned", "fisher", "fisher"]
    assert merged["points"][2]["measured"]["speedup"] == 1.3 and "measured" not in untimed["results"]["points"][1]
    assert len(merged_pareto(timed, timed)["points"]) == 2  # a point in two runs is listed once
    timed["results"]["points"][1]["measured"]["model"] = "recovered"  # a recovered model's timing is its own
    assert "measured" not in merged_pareto(timed, untimed)["points"][2]
    assert pareto_table(merged).count("| unpruned |") == 1
    other = run("fisher", 1.0)
    other["results"]["n_examples"] = 11
    with pytest.raises(ValueError, match="n_examples"):
        merged_pareto(run("fisher", 70.0), other)


def test_fine_tuned_points_are_shown_against_the_control_of_their_own_run():
    """'vs control' is each fine-tuned point's score against its own run's control (perplexity in percent), and the KV
    cache kept is counted from the mask (an emptied layer keeps one phantom KV head)."""
    from headprune.viz.tables import merged_pareto, pareto_table

    def run(control_score, pruned_score, mask):
        base = {"order": "unpruned", "recovery": "none", "step": "0%", "units_removed": 0, "units_total": 6, "score": 50.0}
        base.update(predicted_speedup=1.0, flops_kept=1.0)
        control = {**base, "recovery": "finetune", "control": True, "score": control_score}
        pruned = {**base, "order": "fisher", "recovery": "finetune", "step": "50%", "units_removed": 3, "score": pruned_score}
        pruned.update(mask={"dec_self": mask}, predicted_speedup=1.1, flops_kept=0.9)
        results = {"metric": "perplexity", "higher_is_better": False, "split": "eval", "n_examples": 10, "base_score": 50.0}
        results.update(cost="flops", selection_split="importance", unit="kv_group", points=[base, control, pruned])
        return {"results": results}

    uniform = run(40.0, 46.0, [[1, 0, 1], [0, 1, 1]])  # 4 of 6 KV heads kept
    emptied = run(30.0, 45.0, [[0, 0, 0], [1, 0, 1]])  # the empty layer keeps a phantom head: 3 of 6
    table = pareto_table(uniform)
    row = next(line for line in table.splitlines() if line.startswith("| fisher+finetune"))
    assert "| +15.0% |" in row and f"| {100 * 4 / 6:.1f}% |" in row and "vs control" in table
    merged = merged_pareto(uniform, emptied)
    assert [p.get("control_score") for p in merged["points"] if p["order"] == "fisher"] == [40.0, 30.0]
    assert sum(1 for p in merged["points"] if p.get("control")) == 2
    rows = [line for line in pareto_table(merged).splitlines() if line.startswith("| fisher+finetune")]
    assert "| +50.0% |" in rows[1] and "| 50.0% |" in rows[1]


def test_target_and_recovery_from_the_command_line(tmp_path, monkeypatch):
    from headprune import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = [
        "headprune",
        "experiment=prune",
        *NLI,
        "logger=none",
        "device=cpu",
        "prune.order=fisher",
        "prune.target={speedup:1.05}",
        "prune.recover=lsq",
        "prune.recover_examples=16",
        f"hydra.run.dir={tmp_path}/run",
        f"paths.data_dir={tmp_path}/data",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        cli.main()
    except SystemExit as exit_:
        assert not exit_.code
    assert [p["recovery"] for p in points_of(tmp_path / "run")] == ["none", "lsq"]


def test_study_adds_a_pareto_stage(tmp_path):
    over = [
        "study.n_samples=20",
        "prune.step=0.5",
        "prune.order=[importance,fisher]",
        "prune.target={speedup:1.05}",
        "prune.recover=lsq",
        "prune.recover_examples=16",
        "study.extra_splits=[]",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=1",
        "speed.warmup=1",
        "study.train=false",
    ]
    study.run(make_cfg(tmp_path, "study", TASK, *over))
    payload = results(tmp_path)
    points = payload["results"]["pareto"]["points"]
    assert [(p["order"], p["recovery"]) for p in points] == [("unpruned", "none"), ("importance", "lsq"), ("fisher", "lsq")]
    assert "pareto.png" in payload["figures"] and (tmp_path / "stages" / "pareto.json").exists()


@pytest.fixture(scope="module")
def mt_task(tmp_path_factory):
    from headprune.tasks import registry

    return registry.load_task(make_cfg(tmp_path_factory.mktemp("mt"), "ablate", "mt"))


def test_seq2seq_target_with_every_recovery(mt_task, tmp_path, monkeypatch):
    from headprune.tasks import registry

    monkeypatch.setattr(registry, "load_task", lambda cfg: mt_task)
    cfg = make_cfg(
        tmp_path, "prune", "mt", "prune.order=fisher", "prune.target={speedup:1.1}", "prune.recover=[none,lsq,finetune]", *QUICK_FINETUNE
    )
    prune.run(cfg)
    points = points_of(tmp_path)
    assert [p["recovery"] for p in points] == ["none", "none", "lsq", "finetune"]
    assert len({repr(p["mask"]) for p in points[1:]}) == 1 and points[1]["predicted_speedup"] >= 1.1
    batches = mt_task.training_batches(10, seed=0)
    assert sum(len(b["input_ids"]) for b in batches) >= 10 and "ids" not in batches[0]
    assert mt_task.per_example_loss(batches[0]).shape == (len(batches[0]["input_ids"]),)
    assert results(tmp_path)["results"]["selection_split"] == "heldout"


def test_decoder_only_lm_with_a_drop_target_and_a_schedule(tmp_path):
    """Perplexity (lower is better): a max_drop target on the held-out texts, and a schedule of targets with lsq."""
    from experiment_helpers import compose_cfg

    lm = [
        "experiment=prune",
        "model=tiny_llama",
        "data=lm_synthetic",
        "data.synthetic.sizes.eval=24",
        "data.synthetic.sizes.importance=40",
        "data.synthetic.sizes.heldout=8",
        "data.eval_batch_size=7",
        "logger=none",
        "device=cpu",
        "prune.order=fisher",
    ]
    prune.run(compose_cfg(tmp_path / "drop", [*lm, "prune.target={max_drop:0.5}"]))
    payload = results(tmp_path / "drop")["results"]
    assert payload["higher_is_better"] is False and payload["selection_split"] != payload["split"] == "eval"
    prune.run(
        compose_cfg(
            tmp_path / "schedule", [*lm, "prune.schedule=[{speedup:1.05},{speedup:1.1}]", "prune.recover=lsq", "prune.recover_examples=16"]
        )
    )
    points = points_of(tmp_path / "schedule")
    assert [p["step"] for p in points] == ["0%", "speedup=1.05", "speedup=1.1"]
    assert points[1]["predicted_speedup"] >= 1.05 and points[2]["predicted_speedup"] >= 1.1


def test_speed_experiment_checks_a_pareto_point_beside_its_target(shared_task, tmp_path):
    from headprune.experiments import speed
    from headprune.validation import validate
    from headprune.viz.tables import speed_table

    prune.run(make_cfg(tmp_path / "p", "prune", TASK, "prune.order=fisher", "prune.target={speedup:1.05}", "prune.recover=[none,lsq]"))
    point = points_of(tmp_path / "p")[2]
    cfg = make_cfg(
        tmp_path / "s",
        "speed",
        TASK,
        f"speed.mask_file={tmp_path / 'p' / 'results.json'}",
        "speed.mask_order=fisher+lsq",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=2",
        "speed.max_repeats=2",
        "speed.warmup=1",
    )
    validate(cfg)  # the mask file's Pareto masks are checked before any work
    speed.run(cfg)
    payload = results(tmp_path / "s")
    assert payload["results"]["units_removed"] == point["units_removed"] and payload["inputs"]["step"] == "speedup=1.05"
    assert payload["results"]["target"]["speedup"] == 1.05 and "Speed-up target 1.05" in speed_table(payload)
    with pytest.raises(ValueError, match="no Pareto points of 'entropy'"):
        speed.run(make_cfg(tmp_path / "e", "speed", TASK, f"speed.mask_file={tmp_path / 'p' / 'results.json'}", "speed.mask_order=entropy"))
