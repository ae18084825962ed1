"""A recovery never makes a point worse in silence; prune.save=all keeps every point's model, the mask alone's too."""

from __future__ import annotations

import pytest
import torch
from experiment_helpers import make_cfg, results, task_fixtures

from headprune.experiments import prune

TASK = "nli"
task, shared_task = task_fixtures(TASK)


def _points(tmp_path) -> dict:
    return {f"{p['order']}+{p['recovery']}": p for p in results(tmp_path)["results"]["points"]}


def test_save_all_keeps_the_point_without_recovery_and_it_scores_its_row(shared_task, tmp_path):
    from headprune.core.attention.gates import HeadGates
    from headprune.core.saving import load_pruned
    from headprune.measures.evaluation import swapped_model

    prune.run(make_cfg(tmp_path, "prune", TASK, "prune.fractions=[0.5]", "prune.recover=[none,lsq]", "prune.save=all"))
    points = _points(tmp_path)
    alone, recovered = points["importance+none"], points["importance+lsq"]
    assert alone["model_dir"] == "models/importance@50pct" and recovered["model_dir"] == "models/importance+lsq@50pct"
    for point in (alone, recovered):
        model = load_pruned(tmp_path / point["model_dir"])
        with swapped_model(shared_task, model, HeadGates(model)):
            score = shared_task.evaluate(None, split="eval").score
        assert score == pytest.approx(point["score"], rel=1e-6)
    written = (tmp_path / alone["model_dir"] / "recipe.json").stat().st_mtime_ns
    prune.run(make_cfg(tmp_path, "prune", TASK, "prune.fractions=[0.5]", "prune.recover=[none,lsq]", "prune.save=all", "overwrite=true"))
    assert (tmp_path / alone["model_dir"] / "recipe.json").stat().st_mtime_ns == written  # the same mask alone: kept, not written again


def test_save_by_name_keeps_only_the_named_point_without_recovery(shared_task, tmp_path):
    prune.run(make_cfg(tmp_path, "prune", TASK, "prune.fractions=[0.5]", "prune.recover=[none,lsq]", "prune.save=[importance@50%]"))
    points = _points(tmp_path)
    assert points["importance+none"]["model_dir"] == "models/importance@50pct" and "model_dir" not in points["importance+lsq"]


def test_planned_points_are_the_points_the_run_makes(shared_task, tmp_path):
    from headprune.sources.point_models import point_names
    from headprune.stages.greedy_stage import fractions_of, orders_of
    from headprune.stages.pareto_plan import planned_points

    overrides = ("prune.order=[importance,fisher]", "prune.fractions=[0.25,0.5]", "prune.recover=[none,lsq]", "prune.rearrange=both")
    cfg = make_cfg(tmp_path, "prune", TASK, *overrides)
    planned = planned_points(cfg.prune, orders_of(cfg.prune), fractions_of(cfg.prune))
    prune.run(cfg)
    assert planned == point_names(results(tmp_path)["results"]["points"])
    assert "fisher+rearrange+lsq@25%" in planned and len(planned) == 16


def test_every_recovered_point_is_checked_against_its_mask_alone_on_the_selection_split(shared_task, tmp_path):
    prune.run(make_cfg(tmp_path, "prune", TASK, "prune.fractions=[0.5]", "prune.recover=[none,lsq]"))
    payload = results(tmp_path)["results"]
    points = _points(tmp_path)
    check = points["importance+lsq"]["recovery_check"]
    mask = {g: torch.tensor(m) for g, m in points["importance+none"]["mask"].items()}
    alone = shared_task.evaluate(mask, split=payload["selection_split"]).score
    assert check["split"] == payload["selection_split"] == shared_task.selection_split
    assert check["mask_alone"] == pytest.approx(alone, rel=1e-9)
    assert check["worse"] == (check["recovered"] < check["mask_alone"])  # accuracy: higher is better
    assert payload["recoveries_worse"] == (["importance+lsq@50%"] if check["worse"] else [])
    assert "recovery_check" not in points["importance+none"]


def test_a_recovery_that_makes_its_point_worse_says_so_in_one_line(shared_task, tmp_path, monkeypatch, capsys):
    base_model, evaluate = shared_task.model, type(shared_task).evaluate

    def recovered_scores_lower(self, mask=None, split="eval", **kwargs):  # every model but the base one: 10 points lower
        result = evaluate(self, mask, split, **kwargs)
        if self.model is not base_model:
            result.score -= 10.0
        return result

    monkeypatch.setattr(type(shared_task), "evaluate", recovered_scores_lower)
    prune.run(make_cfg(tmp_path, "prune", TASK, "prune.fractions=[0.25]", "prune.recover=[none,lsq]"))
    payload = results(tmp_path)["results"]
    check = _points(tmp_path)["importance+lsq"]["recovery_check"]
    assert check["worse"] and check["recovered"] < check["mask_alone"]
    assert payload["recoveries_worse"] == ["importance+lsq@25%"]
    lines = [line for line in capsys.readouterr().err.splitlines() if "recovery made" in line]
    assert lines == [
        f"headprune: warning: the lsq recovery made importance+lsq@25% worse than its mask alone on the selection split "
        f"{check['split']}: accuracy {check['recovered']:.4g} against {check['mask_alone']:.4g} without recovery"
    ]


def test_a_damaged_saved_model_is_named_and_computed_again(shared_task, tmp_path, capsys):
    from headprune.core.saving import load_pruned

    overrides = ("prune.fractions=[0.5]", "prune.recover=[none,lsq]", "prune.save=all")
    prune.run(make_cfg(tmp_path, "prune", TASK, *overrides))
    folders = [tmp_path / p["model_dir"] for p in _points(tmp_path).values() if "model_dir" in p]
    assert len(folders) == 2
    for folder in folders:
        weights = folder / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])  # a truncated copy
    capsys.readouterr()
    prune.run(make_cfg(tmp_path, "prune", TASK, *overrides, "overwrite=true"))
    printed = capsys.readouterr().out
    assert sorted(tmp_path / p["model_dir"] for p in _points(tmp_path).values() if "model_dir" in p) == sorted(folders)
    for folder in folders:
        assert f"({folder}) cannot be loaded" in printed and "computing it again" in printed
        assert sum(p.numel() for p in load_pruned(folder).parameters()) > 0  # written again
