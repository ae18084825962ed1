"""Mask rearrangement in the prune experiment: Pareto points with and without, counts kept, the CLI."""

from __future__ import annotations

import sys

import torch
from experiment_helpers import NLI, make_cfg, results, task_fixtures

from headprune.experiments import prune

TASK = "nli"
task, shared_task = task_fixtures(TASK)


def test_both_rearrangements_for_fractions_and_recoveries(shared_task, tmp_path):
    from conftest import fisher_blocks

    from headprune.selection.rearrange import quadratic_form
    from headprune.viz.tables import pareto_rows

    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.order=fisher",
        "prune.fractions=[0.25,0.5]",
        "prune.recover=[none,lsq]",
        "prune.rearrange=both",
        "prune.recover_examples=16",
    )
    prune.run(cfg)
    payload = results(tmp_path)
    points = payload["results"]["points"]
    names = pareto_rows(payload["results"])[1]
    assert [row[0] for row in names] == [
        "unpruned",
        *["fisher"] * 2,
        *["fisher+lsq"] * 2,
        *["fisher+rearrange"] * 2,
        *["fisher+rearrange+lsq"] * 2,
    ]
    blocks = fisher_blocks(shared_task.model, shared_task.gates, shared_task.importance_batches())
    plain = {p["step"]: p for p in points[1:] if not p["rearranged"] and p["recovery"] == "none"}
    for p in points[1:]:
        if not p["rearranged"]:
            assert "rearrangement" not in p
            continue
        mask, before = torch.tensor(p["mask"]["enc_self"]), torch.tensor(plain[p["step"]]["mask"]["enc_self"])
        assert torch.equal(mask.sum(1), before.sum(1)) and p["predicted_speedup"] == plain[p["step"]]["predicted_speedup"]
        info = p["rearrangement"]
        assert info["exact"] and info["fisher_form_after"] <= info["fisher_form_before"] + 1e-12
        form = float(quadratic_form({"enc_self": mask}, blocks)["enc_self"].sum())
        assert abs(form - info["fisher_form_after"]) <= 1e-6 * max(1.0, form)  # the recorded form is the mask's
        if info["layers_changed"] == 0:
            assert torch.equal(mask, before) and p["score"] == plain[p["step"]]["score"]


def test_rearranged_masks_are_what_a_drop_target_checks(shared_task, tmp_path, monkeypatch):
    from headprune.stages import prune_speed

    checked = []
    real = prune_speed.rearranged

    def spy(task, mask, ctx):
        out = real(task, mask, ctx)
        checked.append(out[0])
        return out

    monkeypatch.setattr(prune_speed, "rearranged", spy)
    cfg = make_cfg(tmp_path, "prune", TASK, "prune.order=importance", "prune.target={max_drop:100.0}", "prune.rearrange=true")
    prune.run(cfg)
    point = results(tmp_path)["results"]["points"][1]
    assert point["rearranged"] and point["order"] == "importance" and len(checked) >= 2  # the bisection's masks, then the point's
    assert torch.equal(torch.tensor(point["mask"]["enc_self"]), checked[-1]["enc_self"])


def test_rearrange_from_the_command_line(tmp_path, monkeypatch):
    from headprune import cli

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = [
        "headprune",
        "experiment=prune",
        *NLI,
        "logger=none",
        "device=cpu",
        "prune.order=fisher",
        "prune.rearrange=true",
        "prune.fractions=[0.5]",
        f"hydra.run.dir={tmp_path}/run",
        f"paths.data_dir={tmp_path}/data",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    try:
        cli.main()
    except SystemExit as exit_:
        assert not exit_.code
    points = results(tmp_path / "run")["results"]["points"]
    assert [(p["order"], p.get("rearranged"), p["recovery"], p["step"]) for p in points] == [
        ("unpruned", None, "none", "0%"),
        ("fisher", True, "none", "50%"),
    ]
