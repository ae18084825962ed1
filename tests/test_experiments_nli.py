"""Every experiment on the NLI task (tiny BERT, synthetic NLI): results.json, figures, and bad input."""

from __future__ import annotations

import json

import pytest
import torch
from experiment_helpers import ROOT, make_cfg, results, task_fixtures

from headprune.experiments import ablate, keep_one, prune, speed, study
from headprune.measures import evaluation
from headprune.stages import greedy_stage

TASK = "nli"


task, shared_task = task_fixtures(TASK)


def test_ablate(shared_task, tmp_path):
    cfg = make_cfg(tmp_path, "ablate", TASK, "ablate.splits=[eval,eval_mismatched]")
    ablate.run(cfg)
    payload = results(tmp_path)
    res = payload["results"]
    one = res["splits"]["eval"]
    layers, heads = shared_task.gates.groups["enc_self"]
    assert len(one["rows"]) == layers * heads and len(one["delta"]["enc_self"]) == layers
    assert {"delta", "p_value", "significant", "ci_low", "ci_high"} <= set(one["rows"][0])
    assert "pearson_r" in res["correlation"]
    assert payload["figures"] == ["ablate_eval.png", "ablate_eval_mismatched.png"]
    # the batched evaluation equals one evaluation per mask
    mask = shared_task.gates.ones()
    mask["enc_self"][1, 2] = 0
    assert one["rows"][1 * heads + 2]["score"] == pytest.approx(shared_task.evaluate(mask).score)


def test_keep_one(shared_task, tmp_path):
    cfg = make_cfg(tmp_path, "keep_one", TASK, "keep_one.n_samples=100")
    keep_one.run(cfg)
    res = results(tmp_path)["results"]
    assert res["selection_split"] == "importance" and res["split"] == "eval"
    assert len(res["rows"]) == shared_task.gates.groups["enc_self"][0]
    row = res["rows"][0]
    mask = shared_task.gates.ones()
    mask["enc_self"][0] = 0
    mask["enc_self"][0, row["best_head"]] = 1
    assert row["score"] == pytest.approx(shared_task.evaluate(mask).score)


@pytest.mark.parametrize(
    "order,extra",
    [
        ("importance", ["prune.reestimate=true"]),
        ("random", ["prune.min_units_per_layer=1"]),
        ("entropy", []),
        ("ablation", ["prune.n_samples=50"]),
    ],
)
def test_prune_orders(shared_task, tmp_path, order, extra):
    cfg = make_cfg(tmp_path, "prune", TASK, f"prune.order={order}", "prune.step=0.25", *extra)
    prune.run(cfg)
    res = results(tmp_path)["results"]
    steps = res["orders"][order]["steps"]
    assert [s["fraction"] for s in steps] == [0.0, 0.25, 0.5, 0.75]
    assert [s["units_removed"] for s in steps] == [0, 2, 4, 6]
    if "prune.min_units_per_layer=1" in extra:
        assert all(min(sum(row) for row in s["mask"]["enc_self"]) >= 1 for s in steps)
    assert steps[0]["score"] == pytest.approx(res["base_score"])
    assert res["reestimate"] == res["orders"][order]["reestimated"] == ("prune.reestimate=true" in extra)


def test_reestimate_is_recorded_per_order(shared_task, tmp_path):
    """results.json says an order was re-estimated only when it was: random and ablation cannot be."""
    from omegaconf import OmegaConf

    from headprune.settings import RunSettings
    from headprune.sources.orders import OrderSettings

    settings = OrderSettings(OmegaConf.load(ROOT / "conf" / "importance" / "default.yaml"), seed=0, ablation_split="eval", n_samples=50)
    cfg = make_cfg(tmp_path, "prune", TASK, "prune.min_units_per_layer=0", "prune.layout=global", "prune.joint_scale=relative")
    prune_settings = RunSettings.of(cfg).prune
    only_random = greedy_stage.prune_stage(
        shared_task, prune_settings, ["random"], [0.0, 0.5], settings, "eval", None, reestimate=True, progress=False
    )
    assert only_random["reestimate"] is False and only_random["reestimated_orders"] == []
    mixed = greedy_stage.prune_stage(
        shared_task, prune_settings, ["importance", "random"], [0.0, 0.5], settings, "eval", None, reestimate=True, progress=False
    )
    assert mixed["reestimate"] is True and mixed["reestimated_orders"] == ["importance"]
    assert mixed["orders"]["importance"]["reestimated"] and not mixed["orders"]["random"]["reestimated"]


def test_speed_and_mask_file(shared_task, tmp_path):
    cfg = make_cfg(tmp_path / "p", "prune", TASK, "prune.fractions=[0.5]")
    prune.run(cfg)
    cfg = make_cfg(
        tmp_path,
        "speed",
        TASK,
        f"speed.mask_file={tmp_path / 'p' / 'results.json'}",
        "speed.batch_sizes=[1,4]",
        "speed.examples=8",
        "speed.repeats=2",
        "speed.warmup=1",
    )
    speed.run(cfg)
    res = results(tmp_path)["results"]
    assert res["score_check"]["equal"] and res["units_removed"] == 4
    assert [r["batch_size"] for r in res["rows"]] == [1, 4]
    assert all(r["flop_ideal_gain"] > 0 and r["original"]["examples_per_s"] > 0 for r in res["rows"])
    assert res["cost"]["pruned"]["attention_flops"] < res["cost"]["original"]["attention_flops"]


def test_speed_mask_order_picks_the_mask(shared_task, tmp_path):
    """Without a mask file, speed.mask_order names the order whose lowest speed.fraction of the heads go."""
    from headprune.results.run_dir import mask_to_json
    from headprune.selection.greedy import random_scores
    from headprune.selection.uniform import layout_masks

    cfg = make_cfg(tmp_path, "speed", TASK, "speed.mask_order=random", "speed.fraction=0.25", "speed.batch_sizes=[4]", "speed.examples=8")
    speed.run(cfg)
    res = results(tmp_path)["results"]
    expected = layout_masks(random_scores(shared_task.gates.groups, 0), shared_task.gates.groups, [0.25])[0]
    assert res["mask"] == mask_to_json(expected) and res["units_removed"] == 2


@pytest.mark.parametrize(
    "experiment,override,message",
    [
        ("prune", "prune.fractions=[1.0]", "outside [0, 1)"),
        ("prune", "prune.fractions=[-0.1]", "outside [0, 1)"),
        ("prune", "prune.order=magnitude", "unknown pruning order"),
        ("prune", "prune.groups=[enc_dec]", "unknown attention group"),
        ("ablate", "data.synthetic.eval_size=0", "empty"),
        ("speed", "speed.fraction=1.5", "outside [0, 1)"),
    ],
)
def test_bad_input_fails_before_work(tmp_path, experiment, override, message, monkeypatch):
    calls = []
    from headprune.tasks.nli.task import NLIModule

    monkeypatch.setattr(NLIModule, "evaluate_many", lambda *a, **k: calls.append(1))
    monkeypatch.setattr(NLIModule, "evaluate", lambda *a, **k: calls.append(1))
    cfg = make_cfg(tmp_path, experiment, TASK, override)
    runner = {"prune": prune.run, "ablate": ablate.run, "speed": speed.run}[experiment]
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        runner(cfg)
    assert not calls and not (tmp_path / "results.json").exists()


def test_mask_file_for_another_model(shared_task, tmp_path):
    (tmp_path / "mask.json").write_text(json.dumps({"mask": {"enc_self": [[1, 0], [1, 1]]}}))
    cfg = make_cfg(tmp_path, "speed", TASK, f"speed.mask_file={tmp_path / 'mask.json'}")
    with pytest.raises(ValueError, match="does not fit this model"):
        speed.run(cfg)
    (tmp_path / "soft.json").write_text(json.dumps({"mask": {"enc_self": [[1, 0.5, 1, 1], [1] * 4]}}))
    cfg = make_cfg(tmp_path, "speed", TASK, f"speed.mask_file={tmp_path / 'soft.json'}")
    with pytest.raises(ValueError, match=r"layer 0 head 1 has 0.5 \(0-based ids\); a mask holds 0 \(pruned\) or 1 \(kept\)"):
        speed.run(cfg)
    (tmp_path / "other.json").write_text(json.dumps({"model_fingerprint": "0123456789abcdef", "mask": {"enc_self": [[1] * 4] * 2}}))
    cfg = make_cfg(tmp_path, "speed", TASK, f"speed.mask_file={tmp_path / 'other.json'}")
    with pytest.raises(ValueError, match="another model"):
        speed.run(cfg)


def test_study_resumes(tmp_path):
    over = [
        "study.n_samples=50",
        "prune.step=0.5",
        "study.reestimate=true",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=1",
        "speed.warmup=1",
        "trainer.enable_progress_bar=false",
        "+trainer.enable_model_summary=false",
    ]
    cfg = make_cfg(tmp_path, "study", TASK, *over)
    study.run(cfg)
    payload = results(tmp_path)
    res = payload["results"]
    assert {"ablate", "keep_one", "prune", "speed", "scores"} <= set(res) and payload["inputs"]["data"] == "nli_synthetic"
    assert set(res["prune"]["orders"]) == {
        "importance",
        "ablation",
        "entropy",
        "random",
        "importance (re-estimated)",
        "entropy (re-estimated)",
    }
    assert "correlation" in res["ablate"]
    assert {"ablate_eval.png", "keep_one.png", "prune.png", "speed.png"} <= set(payload["figures"])
    stamps = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "stages").iterdir()}
    (tmp_path / "stages" / "speed.json").unlink()  # as if interrupted during the last stage
    cfg = make_cfg(tmp_path, "study", TASK, *over)
    study.run(cfg)
    again = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "stages").iterdir()}
    assert all(again[name] == stamps[name] for name in stamps if name != "speed.json")
    assert "speed.json" in again


def test_study_falls_back_to_synthetic_nli_and_says_so(tmp_path):
    from experiment_helpers import CONF
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict

    with initialize_config_dir(config_dir=CONF, version_base="1.3"):
        cfg = compose("config", overrides=["experiment=study", "model=tiny_bert", "logger=none", "data.limit_eval=33"])
    with open_dict(cfg):
        cfg.paths.data_dir = str(tmp_path / "no-data-here")
        cfg.paths.output_dir = str(tmp_path)
    assert cfg.data.source == "local"
    note = study.choose_data(cfg)
    assert "synthetic" in note and "not found" in note
    assert cfg.data.source == "synthetic" and cfg.data.limit_eval == 33 and cfg.data.importance_size == 150


def test_evaluate_many_reports_every_batch(shared_task):
    """The progress callback sees each evaluation example once, and the chunked results equal one call."""
    masks = [None, *[shared_task.gates.ones() for _ in range(3)]]
    masks[1]["enc_self"][0, 0] = 0
    seen = []
    direct = shared_task.evaluate_many(masks, split="eval", on_batch=seen.append)
    assert sum(seen) == evaluation.split_size(shared_task, "eval")
    chunked = evaluation.evaluate_many(shared_task, masks, "eval", chunk=3, progress=True)
    assert [r.per_example for r in chunked] == [r.per_example for r in direct]


def test_every_reestimable_order_first_step_is_its_fixed_order(shared_task):
    """Re-estimation under an all-ones mask gives the unmasked scores; its first greedy step is the fixed order's."""
    from omegaconf import OmegaConf

    from headprune.selection.uniform import layout_masks
    from headprune.sources.orders import ORDERS, OrderSettings

    settings = OrderSettings(
        importance=OmegaConf.load(ROOT / "conf" / "importance" / "default.yaml"), seed=0, ablation_split="eval", n_samples=50
    )
    groups = list(shared_task.gates.groups)
    prune = OmegaConf.create({"layout": "global", "joint_scale": "relative"})  # the prune settings the masks read
    reestimable = [name for name, order in ORDERS.items() if order.reestimable]
    assert {"importance", "entropy"} <= set(reestimable)
    for name in reestimable:
        fixed = ORDERS[name].scores(shared_task, settings)
        under_ones = ORDERS[name].scores(shared_task, settings, mask=shared_task.gates.ones())
        for group in fixed:
            assert torch.allclose(fixed[group].float(), under_ones[group].float(), atol=1e-6)
        first = greedy_stage.reestimated_masks(shared_task, name, settings, [0.25], groups, 0, False, prune)[0]
        expected = layout_masks(fixed, shared_task.gates.groups, [0.25])[0]
        assert all(torch.equal(first[g], expected[g]) for g in groups)
    with pytest.raises(ValueError, match="cannot be re-estimated"):
        ORDERS["ablation"].scores(shared_task, settings, mask=shared_task.gates.ones())
