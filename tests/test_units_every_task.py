"""Every kind runs experiment=prune on every task's tiny model (nli, mt, lm, vision, passkey), alone or in a joint list."""

from __future__ import annotations

import json

import pytest
from experiment_helpers import make_cfg

from headprune.experiments import prune
from headprune.validation import validate

ATTENTION = {"nli": "head", "mt": "head", "lm": "kv_group", "vision": "head", "passkey": "kv_group"}


@pytest.mark.parametrize("task", list(ATTENTION))
@pytest.mark.parametrize("unit", ["joint", "block", "hidden"])
def test_every_unit_prunes_on_every_task(task, unit, tmp_path):
    unit = f"[{ATTENTION[task]},ffn,layer]" if unit == "joint" else unit
    model = ["model=tiny_t5"] if (task, unit) == ("mt", "hidden") else []  # Marian refuses hidden channels (a bad-input row)
    cfg = make_cfg(tmp_path, "prune", task, *model, f"prune.unit={unit}", "prune.order=fisher", "prune.fractions=[0.3]")
    validate(cfg)
    prune.run(cfg)
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    step = results["orders"]["fisher"]["steps"][-1]
    assert step["units_removed"] > 0 and sum(k["removed"] for k in step["units_by_kind"].values()) == step["units_removed"]
