"""The unit protocol: the registry of kinds, unit_gates for each unit, whole blocks and the KV-group + neuron joint unit.

Each check compares two ways of computing the same thing on a tiny random model (fp32).
"""

import pytest
import torch
from conftest import classifier_batch, seq2seq_batch, tiny_bert, tiny_marian
from tiny_encoders import FAMILY_MODELS
from tiny_llms import lm_batch, tiny_family, tiny_llama, tiny_qwen2

from headprune.core.attention.gates import HeadGates
from headprune.core.attention.kv_groups import KVGroupGates
from headprune.core.block.gates import BlockGates
from headprune.core.ffn.gates import FFNGates
from headprune.core.ffn.pruning import ffn_record
from headprune.core.inputs import model_inputs
from headprune.core.joint import JointGates
from headprune.core.pruning import pruning_record
from headprune.core.unit_kinds import ablation_refusal, group_kind, mask_kinds, unit_kinds, unit_name
from headprune.core.units import base_mask, prune_unit_mask, unit_gates
from headprune.scoring.importance import importance_scores, per_example_gate_gradients

MODELS = {  # a few families: encoder, encoder-decoder, grouped-query decoder, Conv1D decoder, T5
    "bert": (tiny_bert, classifier_batch),
    "marian": (tiny_marian, seq2seq_batch),
    "llama": (tiny_llama, lm_batch),
    "gpt2": (lambda: tiny_family("gpt2"), lm_batch),
    "t5": FAMILY_MODELS["t5"],
}


def _logits(model, batch):
    with torch.no_grad():
        return model(**model_inputs(model, batch)).logits


def _close(actual, expected, rel=1e-5):
    """Equal within ``rel`` of the output scale."""
    torch.testing.assert_close(actual, expected, atol=rel * float(expected.abs().max()), rtol=0)


def _block_mask(groups):
    """Layer 0 loses its attention block and the last layer its FFN block (where the model has them)."""
    mask = {g: torch.ones(layers, 1) for g, (layers, _) in groups.items()}
    for group, value in mask.items():
        value[0 if "_ffn" not in group else -1] = 0
    return mask


def test_unit_kinds_parse_joint_lists_and_refuse_overlaps():
    assert unit_kinds("head+ffn") == unit_kinds(["ffn", "head"]) == ("head", "ffn")
    assert unit_name(["ffn", "kv_group"]) == "kv_group+ffn" and unit_kinds("block") == ("block",)
    with pytest.raises(ValueError, match="both prune the attention part"):
        unit_kinds("head+kv_group")
    with pytest.raises(ValueError, match="both prune the feed_forward part"):
        unit_kinds(["block", "ffn"])
    with pytest.raises(ValueError, match="unknown pruning unit 'neurons'"):
        unit_kinds("neurons")
    assert "no useful pruning order" in ablation_refusal("head+ffn") and ablation_refusal("block") is None
    assert [group_kind(g, "kv_group+ffn") for g in ("dec_self", "dec_ffn", "dec_ffn_block")] == ["kv_group", "ffn", "block"]
    assert mask_kinds(["enc_self_block", "enc_ffn_block"]) == ("block",) and mask_kinds(["dec_self", "dec_ffn"]) == ("head", "ffn")


def test_a_parsed_unit_answers_every_kind_function_as_its_name_does():
    from headprune.core.kinds.kind_registry import Unit, kinds_of, parse_unit

    for given in ("head", ["ffn", "kv_group"], "head+ffn", ["layer"]):
        unit = parse_unit(given)
        assert isinstance(unit, Unit) and parse_unit(unit) is unit and str(unit) == unit.name == unit_name(given)
        assert kinds_of(unit) == kinds_of(given) and unit_kinds(unit) == unit_kinds(given) == tuple(k.name for k in unit.kinds)
        assert unit.is_joint == (len(unit_kinds(given)) > 1) and ablation_refusal(unit) == ablation_refusal(given)
    with pytest.raises(ValueError, match="both prune the attention part"):
        parse_unit(["head", "kv_group"])


def test_unit_gates_gives_each_unit_its_gates_and_reuses_the_model_s_own():
    model = tiny_llama()
    heads = HeadGates(model)
    assert unit_gates(heads, "head") is heads and isinstance(unit_gates(heads, "kv_group"), KVGroupGates)
    assert isinstance(unit_gates(model, "ffn"), FFNGates)
    joint = unit_gates(heads, ["ffn", "kv_group"])
    assert isinstance(joint, JointGates) and joint.unit == "kv_group+ffn" and joint.heads is heads
    assert joint.groups == {"dec_self": (3, 2), "dec_ffn": (3, 64)}
    block = unit_gates(joint, "block")
    assert isinstance(block, BlockGates) and block.heads is heads and block.ffn is joint.ffn
    assert block.groups == {"dec_self_block": (3, 1), "dec_ffn_block": (3, 1)}
    assert unit_gates(block, "head+ffn").groups == {"dec_self": (3, 4), "dec_ffn": (3, 64)}
    assert [g.num_heads for g in (heads, joint, block)] == [12, 6 + 192, 6]
    with pytest.raises(ValueError, match="grouped-query attention"):
        unit_gates(tiny_bert(), "kv_group+ffn")


@pytest.mark.parametrize("name", MODELS)
def test_block_mask_pruned_equals_masked(name):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = unit_gates(model, "block")
    mask = _block_mask(gates.groups)
    with gates.masked(mask):
        masked = _logits(model, batch)
    assert (masked - _logits(model, batch)).abs().max() > 1e-6  # dropping the blocks changes the output
    twin = make()
    records = prune_unit_mask(unit_gates(twin, "block"), mask)
    _close(_logits(twin, batch), masked)
    assert records == {"heads": pruning_record(twin), "ffn": ffn_record(twin)}
    present = unit_gates(twin, "block").present()
    assert all(torch.equal(present[g], m.bool()) for g, m in mask.items())


@pytest.mark.parametrize("name", ["bert", "llama"])
def test_per_example_block_gates_equal_one_mask_at_a_time(name):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = unit_gates(model, "block")
    rows = next(iter(batch.values())).shape[0]
    gen = torch.Generator().manual_seed(0)
    per_example = {g: torch.rand(rows, layers, 1, generator=gen) for g, (layers, _) in gates.groups.items()}
    with gates.masked(per_example):
        together = _logits(model, batch)
    for row in range(rows):
        with gates.masked({g: m[row] for g, m in per_example.items()}):
            _close(together[row], _logits(model, batch)[row])


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
def test_kv_group_and_neuron_joint_mask_pruned_equals_masked(make):
    model, batch = make(), lm_batch()
    gates = unit_gates(model, "kv_group+ffn")
    mask = gates.ones()
    mask["dec_self"][0, 1] = 0  # one KV group with all its query heads
    mask["dec_self"][1] = 0  # a layer without attention
    gen = torch.Generator().manual_seed(0)
    mask["dec_ffn"] = (torch.rand(*mask["dec_ffn"].shape, generator=gen) < 0.5).float()
    mask["dec_ffn"][0] = 0  # an emptied FFN block
    with gates.masked(mask):
        masked = _logits(model, batch)
    with HeadGates(model).masked(None), gates.ffn.masked(mask["dec_ffn"]), gates.heads.masked(gates.parts[0].head_mask(mask["dec_self"])):
        _close(_logits(model, batch), masked)  # the joint gates are the head gates of the KV groups and the neuron gates
    twin = make()
    prune_unit_mask(unit_gates(twin, "kv_group+ffn"), mask)
    _close(_logits(twin, batch), masked)
    twin_gates = unit_gates(twin, "kv_group+ffn")
    assert twin_gates.groups == gates.groups and torch.equal(twin_gates.present()["dec_self"], mask["dec_self"].bool())


def test_block_gate_gradient_is_the_sum_of_its_heads_and_neurons_gradients():
    model, batch = tiny_llama(), lm_batch()
    block = unit_gates(model, "block")
    joint = JointGates(model, [block.heads, block.ffn])
    per_block = per_example_gate_gradients(model, block, batch, unit="block")  # {group_block: (B, L, 1)}
    per_unit = per_example_gate_gradients(model, joint, batch, unit=joint.unit)  # {group: (B, L, units)}
    for group, value in per_unit.items():
        expected = value.sum(-1, keepdim=True)
        torch.testing.assert_close(per_block[group + "_block"], expected, atol=1e-6 * float(expected.abs().max()), rtol=0)
    scores = importance_scores(model, block, [batch], unit="block", normalize_layers=False)
    for group, value in per_block.items():
        torch.testing.assert_close(scores[group].double(), value.abs().mean(0), atol=1e-6 * float(value.abs().max()), rtol=0)


def test_kv_group_and_neuron_scores_equal_kv_group_scores_and_neuron_scores_apart():
    model, batch = tiny_llama(), lm_batch()
    joint = unit_gates(model, "kv_group+ffn")
    together = per_example_gate_gradients(model, joint, batch, unit=joint.unit)
    apart = {
        **per_example_gate_gradients(model, joint.parts[0], batch, unit="kv_group"),
        **per_example_gate_gradients(model, joint.ffn, batch, unit="ffn"),
    }
    assert {g: tuple(v.shape[1:]) for g, v in together.items()} == joint.groups
    for group, value in apart.items():
        torch.testing.assert_close(together[group], value, atol=1e-6 * float(value.abs().max()), rtol=0)


def test_base_mask_of_each_unit_is_the_head_and_neuron_mask_that_acts():
    model = tiny_llama()
    block = unit_gates(model, "block")
    mask = _block_mask(block.groups)
    base = base_mask(block, mask)
    assert base["dec_self"].shape == (3, 4) and base["dec_ffn"].shape == (3, 64)
    assert base["dec_self"][0].sum() == 0 and base["dec_ffn"][-1].sum() == 0 and base["dec_self"][1:].min() == 1
    kv = unit_gates(block, "kv_group")
    assert torch.equal(base_mask(kv, {"dec_self": torch.tensor([[1.0, 0], [1, 1], [0, 0]])})["dec_self"][0], torch.tensor([1.0, 1, 0, 0]))


def test_a_joint_mask_without_one_kind_s_groups_says_that_kind_is_kept_whole():
    model = tiny_llama()
    gates = unit_gates(model, "head+ffn")
    with pytest.warns(UserWarning, match=r"holds no group of ffn: \['dec_ffn'\]: every one of those units is kept"):
        prune_unit_mask(gates, {"dec_self": gates.ones()["dec_self"]})
    assert unit_gates(model, "ffn").present()["dec_ffn"].all()  # no neuron was removed
