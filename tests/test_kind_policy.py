"""Each kind says what it can take part in (lsq recovery, keep-one, being counted as pruned), and the checks ask it."""

from __future__ import annotations

import pytest
from experiment_helpers import make_cfg

from headprune.core.checks import ConfigError
from headprune.core.kinds import KINDS, UnitKind, register_kind, unregister_kind
from headprune.validation import validate

SPEED = "prune.target={speedup:1.3}"


@pytest.mark.parametrize("unit", ["layer"])
def test_lsq_is_refused_for_a_unit_it_cannot_refit(tmp_path, unit):
    with pytest.raises(ConfigError, match=rf"^prune.recover=lsq with prune.unit={unit}: .*fit nothing"):
        validate(make_cfg(tmp_path, "prune", "lm", f"prune.unit={unit}", "prune.recover=[none,lsq]", SPEED))


@pytest.mark.parametrize("unit", ["hidden", "[head,hidden]", "[kv_group,ffn,hidden]"])
def test_lsq_is_refused_beside_removed_residual_channels(tmp_path, unit):
    with pytest.raises(ConfigError, match=r"^prune.recover=lsq with prune.unit=.*hidden: .*prune.recover=reconstruct"):
        validate(make_cfg(tmp_path, "prune", "lm", f"prune.unit={unit}", "prune.recover=[none,lsq]", SPEED))


@pytest.mark.parametrize("unit", ["head", "ffn", "block", "ffn+layer"])
def test_lsq_stays_allowed_where_a_kind_can_be_refitted(tmp_path, unit):
    from headprune.core.unit_kinds import kinds_of, lsq_refusal

    assert lsq_refusal(unit) is None and any(kind.recovery_refusal() is None for kind in kinds_of(unit))
    validate(make_cfg(tmp_path, "prune", "lm", f"prune.unit=[{unit.replace('+', ',')}]", "prune.recover=lsq", SPEED))


@pytest.mark.parametrize("unit", ["layer", "block"])
def test_keep_one_is_refused_for_a_unit_with_one_unit_per_layer(tmp_path, unit):
    with pytest.raises(ConfigError, match=rf"^experiment=keep_one with prune.unit={unit}: .*remove nothing"):
        validate(make_cfg(tmp_path, "keep_one", "lm", f"prune.unit={unit}"))


@pytest.mark.parametrize(("unit", "wanted"), [("head", True), ("kv_group", True), ("layer", False), ("block", False), ("ffn", False)])
def test_the_study_runs_keep_one_only_where_it_measures_something(unit, wanted):
    from types import SimpleNamespace

    from headprune.core.kinds.kind_registry import parse_unit
    from headprune.stages.study_stages import STUDY_STAGES

    stage = next(s for s in STUDY_STAGES if s.name == "keep_one")
    assert stage.wanted(SimpleNamespace(task=SimpleNamespace(gates=SimpleNamespace(unit=parse_unit(unit))))) is wanted


@pytest.mark.parametrize("unit", ["head", "kv_group", "ffn", "hidden", "layer"])
def test_a_model_is_pruned_by_any_kind_and_counts_the_units_its_mask_removed(tmp_path, unit):
    import torch
    from tiny_llms import tiny_llama

    from headprune.core.saving import load_pruned, save_pruned
    from headprune.core.units import prune_unit_mask, unit_gates
    from headprune.export.record import is_pruned, removed_units

    model = tiny_llama()
    assert not is_pruned(model) and removed_units(model) == {}
    gates = unit_gates(model, unit)
    mask = {g: torch.ones(shape) for g, shape in gates.groups.items()}
    group = next(iter(mask))
    gone = 4 if unit == "hidden" else 2  # the stream keeps a multiple of the 4 heads' count
    mask[group].view(-1)[:gone] = 0.0
    records = prune_unit_mask(gates, mask)
    removed = removed_units(model)
    assert is_pruned(model) and sum(removed.values()) == gone * (2 if unit == "kv_group" else 1)  # a KV group: 2 query heads
    assert set(removed) <= set(records)
    save_pruned(model, tmp_path)
    assert removed_units(load_pruned(tmp_path)) == removed


class _Bare(UnitKind):
    """A kind that names itself and its part, and implements only ``owns``."""

    name = "bare"
    parts = ("nowhere",)

    def owns(self, group: str) -> bool:
        return group == "bare"


def _named(name):
    return type("Named", (_Bare,), {"name": name, "gates": _Bare.owns, "flops_tables": _Bare.owns, "prune": _Bare.owns})()


def test_register_kind_names_the_methods_a_kind_lacks():
    with pytest.raises(TypeError, match=r"_Bare \('bare'\) does not implement gates, flops_tables, prune"):
        register_kind(_Bare())
    assert "bare" not in KINDS


@pytest.mark.parametrize("name", ["", "two words", "head+ffn", "a,b", 3, None])
def test_register_kind_refuses_a_name_that_is_no_identifier(name):
    with pytest.raises(ValueError, match="name must be a non-empty identifier-like string"):
        register_kind(_named(name))
    assert name not in KINDS


def test_register_kind_takes_an_instance_and_a_complete_kind_registers():
    with pytest.raises(TypeError, match=r"register_kind\(_Bare\(\)\)"):
        register_kind(_Bare)
    try:
        assert register_kind(_named("complete")) is KINDS["complete"]
    finally:
        unregister_kind("complete")


def test_a_mask_file_of_an_unregistered_kind_is_refused_naming_its_group(tmp_path):
    import json

    from headprune.results.mask_files import read_mask_file

    path = tmp_path / "mask.json"
    path.write_text(json.dumps({"mask": {"dec_self": [[1, 0]], "dec_ffn_half": [[1, 0]]}}))
    with pytest.raises(ConfigError, match=r"^speed.mask_file=.*: mask group 'dec_ffn_half' is of no registered unit kind"):
        read_mask_file(path)
    path.write_text(json.dumps({"results": {"unit": "ffn_half", "points": [{"mask": {"dec_ffn_half": [[1, 0]]}}]}}))
    with pytest.raises(ConfigError, match=r"records prune.unit='ffn_half', which is no registered unit kind"):
        read_mask_file(path, "export")


@pytest.mark.parametrize("reader", ["kind_counts", "kind_classes", "part_of"])
def test_a_group_of_no_kind_is_no_head_to_any_reader(reader):
    from headprune.results.points import kind_counts
    from headprune.selection.joint_scale import kind_classes
    from headprune.selection.uniform import part_of

    read = {"kind_counts": lambda: kind_counts({"dec_ffn_half": [[1, 0]]}), "kind_classes": lambda: kind_classes(["dec_ffn_half"])}
    read["part_of"] = lambda: part_of("dec_ffn_half")
    assert kind_counts({"dec_self": [[1, 0]], "dec_ffn": [[0, 0, 1]]}) == {"head": (1, 2), "ffn": (2, 3)}
    with pytest.raises(ValueError, match="mask group 'dec_ffn_half' is of no registered unit kind"):
        read[reader]()


def test_speed_messages_name_the_units_of_the_unit(tmp_path):

    from headprune.checks.speed_checks import check_removes_some
    from headprune.viz.tables import speed_table

    with pytest.raises(ConfigError, match=r"^speed.fraction=0 prunes no neuron:"):
        validate(make_cfg(tmp_path, "speed", "lm", "prune.unit=ffn", "speed.fraction=0"))
    with pytest.raises(ConfigError, match=r"removes every layer \(3\): nothing would be left to time; keep some layers"):
        check_removes_some(3, 3, "the mask of speed.fraction=1.0", "layer")
    cost = {"parameters": 1, "attention_flops": 1}
    stage = {
        "unit": "hidden",
        "units_removed": 4,
        "units_total": 32,
        "device": "cpu",
        "rows": [],
        "cost": {"original": cost, "pruned": cost},
    }
    assert "4 of 32 channels removed on `cpu`" in speed_table({"results": stage})
