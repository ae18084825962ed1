"""Pruning points are labelled by what they removed; a fraction that cannot be met is said, in results.json and a warning."""

from __future__ import annotations

import json

import pytest
from cli_runs import headprune
from experiment_helpers import NLI

from headprune.core.checks import ConfigWarning
from headprune.results.points import percent, removed_fraction, step_label
from headprune.viz.tables import prune_table

RUN = [*NLI, "logger=none", "device=cpu", "experiment=prune"]  # tiny_bert: 2 layers x 4 heads


def removed_by_mask(step: dict) -> float:
    """The share of heads a step's mask removes, counted from the mask itself."""
    entries = [v for rows in step["mask"].values() for row in rows for v in row]
    return entries.count(0) / len(entries)


@pytest.mark.parametrize(
    "overrides,labels",
    [
        (["prune.layout=uniform", "prune.fractions=[0,0.1,0.2,0.999]"], ["0%", "0% (asked 10%)", "0% (asked 20%)", "75% (asked 99.9%)"]),
        (["prune.min_units_per_layer=3", "prune.fractions=[0,0.5]"], ["0%", "25% (asked 50%)"]),
    ],
    ids=["uniform", "min-heads"],
)
def test_points_say_what_they_removed(capsys, monkeypatch, tmp_path, overrides, labels):
    with pytest.warns(ConfigWarning, match="importance: .* each point is labelled by what it removed"):
        status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "run", *RUN, *overrides)
    assert status == 0, err
    payload = json.loads((tmp_path / "run" / "results.json").read_text())
    steps = payload["results"]["orders"]["importance"]["steps"]
    for step in steps:
        assert step["fraction_removed"] == pytest.approx(removed_by_mask(step), abs=1e-12)
    assert [step_label(s) for s in steps] == labels
    assert [s["fraction_met"] for s in steps] == [label.count("asked") == 0 for label in labels]
    table = prune_table({"results": payload["results"]})
    assert all(f"| {label} |" in table for label in labels), table


def test_a_grid_below_one_step_is_said(capsys, monkeypatch, tmp_path):
    with pytest.warns(ConfigWarning, match=r"prune.max_fraction=0.05 is below prune.step=0.1: the only point is 0%"):
        status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "run", *RUN, "prune.max_fraction=0.05")
    assert status == 0, err


def test_older_files_are_labelled_from_their_counts():
    old = {"fraction": 0.5, "heads_pruned": 2, "heads_total": 8, "score": 1.0}  # a point written before fraction_removed
    assert removed_fraction(old) == 0.25 and step_label(old) == "25% (asked 50%)"
    assert step_label({"fraction": 0.3}) == "30%"  # nothing but the fraction: the fraction
    assert step_label({"fraction": 0.2, "heads_pruned": 14, "heads_total": 72}) == "20%"  # 14.4 rounded: met, as asked
    assert (percent(0.004), percent(0.999), percent(1.0)) == ("0.4%", "99.9%", "100%")


def test_pareto_points_show_a_fraction_by_what_it_removed_and_a_target_as_asked():
    from headprune.results.points import point_step

    assert point_step({"fraction": 0.4, "heads_pruned": 2, "heads_total": 8, "step": "40%"}) == "25% (asked 40%)"
    assert point_step({"fraction": 0.5, "heads_pruned": 4, "heads_total": 8, "step": "50%"}) == "50%"
    assert point_step({"fraction": None, "heads_pruned": 3, "heads_total": 8, "step": "speedup=1.3"}) == "speedup=1.3"
