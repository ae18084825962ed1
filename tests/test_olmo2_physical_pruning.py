"""OLMo 2's q/k norms span all heads, so only kinds that keep every head are pruned physically: FFN neurons and layers,
through experiment=prune, speed and study; heads and KV groups are refused by name in one line, before work."""

from __future__ import annotations

import pytest
from cli_runs import headprune as cli_run
from experiment_helpers import compose_cfg, results

from headprune.validation import validate

TINY_OLMO2 = [
    "model=tiny_olmo2",
    "data=lm_synthetic",
    "data.synthetic.sizes.eval=16",
    "data.synthetic.sizes.importance=16",
    "data.synthetic.sizes.heldout=8",
    "data.tokenizer.vocab_size=200",
    "device=cpu",
    "logger=none",
]
SAVED = ["prune.order=[random]", "prune.fractions=[0.5]", "prune.save=all"]  # each point's model kept


def _cfg(tmp_path, experiment: str, *overrides):
    return compose_cfg(tmp_path, [f"experiment={experiment}", *TINY_OLMO2, *overrides])


@pytest.mark.parametrize(("unit", "recovery"), [("ffn", "lsq"), ("layer", "reconstruct")])
def test_prune_run_saves_pruned_models_that_score_as_masked(tmp_path, monkeypatch, unit, recovery):
    """Each saved point (the mask alone, and after a recovery) loads physically pruned and scores as its row: masked == pruned."""
    from headprune.core.attention.gates import HeadGates
    from headprune.core.saving import load_pruned
    from headprune.experiments import prune
    from headprune.measures.evaluation import swapped_model
    from headprune.tasks import registry

    cfg = _cfg(tmp_path, "prune", f"prune.unit={unit}", f"prune.recover=[none,{recovery}]", *SAVED)
    validate(cfg)
    loaded = []
    load_task = registry.load_task
    monkeypatch.setattr(registry, "load_task", lambda c: loaded.append(load_task(c)) or loaded[-1])
    prune.run(cfg)
    points = [p for p in results(tmp_path)["results"]["points"] if p.get("model_dir")]
    assert sorted(p["recovery"] for p in points) == sorted(["none", recovery])
    task = loaded[0].task  # the run's task (its unit view wraps it)
    for point in points:
        model = load_pruned(tmp_path / point["model_dir"])
        assert model.num_parameters() < task.model.num_parameters()  # physically smaller
        with swapped_model(task, model, HeadGates(model)):
            score = task.evaluate(None, split="eval").score
        assert score == pytest.approx(point["score"], rel=1e-6), point["recovery"]


@pytest.mark.parametrize("unit", ["ffn", "layer", "[ffn,layer]"])
@pytest.mark.parametrize(
    ("experiment", "overrides"),
    [
        ("prune", ["prune.recover=finetune"]),
        ("prune", ["prune.recover=reconstruct"]),
        ("prune", ["prune.measure_speed=true"]),
        ("speed", []),
        ("study", ["study.train=false", "prune.order=[importance]"]),  # on the command line it fits its orders to the unit
    ],
)
def test_physical_pruning_of_whole_heads_kinds_passes(tmp_path, experiment, overrides, unit):
    validate(_cfg(tmp_path, experiment, f"prune.unit={unit}", *overrides))


@pytest.mark.parametrize(("unit", "named"), [("head", r"heads \(head\)"), ("kv_group", r"KV groups \(kv_group\)")])
@pytest.mark.parametrize(
    ("experiment", "overrides"),
    [("prune", ["prune.recover=finetune"]), ("speed", []), ("study", ["study.train=false"])],
)
def test_head_kinds_are_refused_in_one_line(capsys, monkeypatch, tmp_path, experiment, overrides, unit, named):
    import re

    run_dir = tmp_path / "run"
    status, err = cli_run(capsys, monkeypatch, tmp_path, run_dir, *TINY_OLMO2, f"experiment={experiment}", f"prune.unit={unit}", *overrides)
    assert status == 2
    errors = [line for line in err.splitlines() if line.startswith("headprune: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert re.search(
        rf"its unit removes {named}.*normalises all heads together.*kinds ffn, layer, hidden, vocab are removed exactly", errors[0]
    )
    assert not (run_dir / "results.json").exists()
