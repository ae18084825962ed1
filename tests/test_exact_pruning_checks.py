"""Runs that would physically prune a model whose pruning cannot be exact are refused by the config check, before work."""

from __future__ import annotations

import pytest
from experiment_helpers import LM, compose_cfg, results

from headprune.core.checks import ConfigError
from headprune.validation import validate

OLMO2 = ["model.config.model_type=olmo2"]  # q/k norms over all heads together
ALIBI_FALCON = ["model.config.model_type=falcon", "+model.config.alibi=true"]
NORMS = r"normalises all heads together.*cannot equal the masked one"
ALIBI = r"alibi=True cannot be pruned physically.*ALiBi"


def _cfg(tmp_path, experiment: str, *overrides):
    return compose_cfg(tmp_path, [f"experiment={experiment}", *LM, "device=cpu", "logger=none", *overrides])


@pytest.mark.parametrize(
    ("experiment", "overrides"),
    [
        ("speed", []),
        ("study", []),
        ("prune", ["prune.recover=finetune"]),
        ("prune", ["prune.recover=lsq"]),  # its recovered points are saved pruned (prune.save=recovered)
        ("prune", ["prune.measure_speed=true"]),
        ("prune", ["prune.schedule=[0.25,0.5]", "prune.save=none"]),
    ],
)
@pytest.mark.parametrize(("model", "reason"), [(OLMO2, NORMS), (ALIBI_FALCON, ALIBI)])
def test_physical_pruning_is_refused_before_work(tmp_path, experiment, overrides, model, reason):
    with pytest.raises(ConfigError, match=r"this run prunes physically.*experiment=ablate"):
        validate(_cfg(tmp_path, experiment, *model, *overrides))
    with pytest.raises(ConfigError, match=reason):
        validate(_cfg(tmp_path, experiment, *model, *overrides))


def test_export_of_a_mask_is_refused(tmp_path):
    mask_file = tmp_path / "mask" / "results.json"
    with pytest.raises(ConfigError, match=rf"export.mask_file.*{NORMS}|{NORMS}.*export.mask_file"):
        validate(_cfg(tmp_path, "export", *OLMO2, f"export.mask_file={mask_file}"))


@pytest.mark.parametrize(
    ("experiment", "overrides"),
    [
        ("ablate", []),
        ("keep_one", []),
        ("prune", []),
        ("prune", ["prune.recover=lsq", "prune.save=none", "prune.fractions=[0.5]"]),  # lsq scales the masked model
    ],
)
def test_gates_only_runs_pass_on_olmo2(tmp_path, experiment, overrides):
    validate(_cfg(tmp_path, experiment, *OLMO2, *overrides))
    validate(_cfg(tmp_path, experiment, *ALIBI_FALCON, *overrides))


def test_same_models_prune_physically_where_exact(tmp_path):
    validate(_cfg(tmp_path, "speed"))  # the tiny Llama
    validate(_cfg(tmp_path, "speed", "model.config.model_type=falcon", "+model.config.alibi=false"))


def test_plain_prune_runs_on_olmo2(tmp_path):
    """A plain greedy pruning curve only masks heads: it runs to the end on OLMo 2."""
    from headprune.experiments import prune

    prune.run(_cfg(tmp_path, "prune", *OLMO2, "prune.order=[random]", "prune.fractions=[0,0.5]"))
    steps = results(tmp_path)["results"]["orders"]["random"]["steps"]
    assert [s["units_removed"] for s in steps] == [0, 4]


@pytest.mark.parametrize("unit", ["ffn", "layer", "[ffn,layer]"])
def test_olmo2_export_of_ffn_neurons_or_layers_passes(tmp_path, unit):
    """Removing FFN neurons or whole layers leaves every head and its q/k norms whole: exact, so the export check takes it."""
    import json

    mask = {"dec_ffn": [[1] * 32 + [0] * 32, [1] * 64], "dec_layer": [[1], [0]]}
    mask_file = tmp_path / "mask.json"
    mask_file.write_text(json.dumps({"mask": {group: rows for group, rows in mask.items() if group[4:] in unit}}))
    overrides = ["model=tiny_olmo2", "export.format=gguf", "export.tokenizer_pre=gpt-2", f"prune.unit={unit}"]
    validate(_cfg(tmp_path, "export", *overrides, f"export.mask_file={mask_file}"))
    mask_file.write_text(json.dumps({"mask": {"dec_self": [[1, 1, 0, 0], [1, 1, 1, 1]]}}))
    with pytest.raises(ConfigError, match=rf"{NORMS}.*kinds ffn, layer, hidden, vocab are removed exactly"):
        validate(_cfg(tmp_path, "export", "model=tiny_olmo2", "export.format=gguf", f"export.mask_file={mask_file}"))


@pytest.mark.parametrize("unit", ["hidden", "vocab", "[ffn,hidden,layer]"])
def test_olmo2_prunes_channels_and_tokens_physically(tmp_path, unit):
    """Residual channels and token rows keep every head and its q/k norms whole: a physical prune of them passes."""
    validate(_cfg(tmp_path, "prune", *OLMO2, f"prune.unit={unit}", "prune.recover=finetune", "prune.fractions=[0.25]"))


def test_olmo2_refuses_the_head_kinds_of_a_list_by_name(tmp_path):
    with pytest.raises(
        ConfigError,
        match=rf"its unit removes KV groups \(kv_group\), and olmo2 attention {NORMS}.*kinds ffn, layer, hidden, vocab are removed exactly",
    ):
        validate(_cfg(tmp_path, "prune", *OLMO2, "prune.unit=[kv_group,hidden]", "prune.recover=reconstruct", "prune.fractions=[0.25]"))
