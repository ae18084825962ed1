"""prune.layout=uniform through the experiments: plain curves (heads and KV groups), targets and schedules."""

from __future__ import annotations

import pytest
from conftest import is_uniform
from experiment_helpers import make_cfg, results, task_fixtures

from headprune.results.run_dir import mask_from_json

task, shared_task = task_fixtures("lm")


def run(tmp_path, experiment: str, *overrides) -> dict:
    from hydra.utils import get_method

    from headprune.validation import validate

    cfg = make_cfg(tmp_path, experiment, "lm", *overrides)
    validate(cfg)
    get_method(cfg.run)(cfg)
    return results(tmp_path)["results"]


@pytest.mark.parametrize("unit", ["head", "kv_group"])
def test_prune_curves_in_the_uniform_layout(shared_task, tmp_path, unit):
    result = run(
        tmp_path,
        "prune",
        f"prune.unit={unit}",
        "prune.layout=uniform",
        "prune.order=[importance,random]",
        "prune.fractions=[0,0.3,0.5,0.75]",
    )
    assert result["layout"] == "uniform"
    per_layer = shared_task.gates.groups["dec_self"][1] if unit == "head" else shared_task.gates.kv_groups["dec_self"][1]
    for order in result["orders"].values():
        for step in order["steps"]:
            mask = mask_from_json(step["mask"])
            assert is_uniform(mask)
            assert step["units_removed"] == 2 * int(step["fraction"] * per_layer + 1e-9)  # 2 layers


def test_a_speedup_target_and_a_schedule_in_the_uniform_layout(shared_task, tmp_path):
    result = run(tmp_path, "prune", "prune.layout=uniform", "prune.order=fisher", "prune.target={speedup:1.05}")
    point = result["points"][1]
    assert is_uniform(mask_from_json(point["mask"])) and point["predicted_speedup"] >= 1.05
    result = run(
        tmp_path / "schedule",
        "prune",
        "prune.layout=uniform",
        "prune.order=fisher",
        "prune.schedule=[0.25,0.5]",
        "prune.recover=lsq",
        "prune.recover_examples=8",
    )
    for point in result["points"][1:]:
        mask = mask_from_json(point["mask"])
        assert is_uniform(mask) and point["units_removed"] == 2 * int(point["fraction"] * 4)


def test_a_bad_layout_is_a_config_error(tmp_path):
    from headprune.core.checks import ConfigError
    from headprune.validation import validate

    with pytest.raises(ConfigError, match="prune.layout"):
        validate(make_cfg(tmp_path, "prune", "lm", "prune.layout=even"))
