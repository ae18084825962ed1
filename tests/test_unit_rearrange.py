"""Rearrangement in any unit: a joint mask is each kind rearranged apart, from one set of gate gradients; blocks have none."""

import pytest
import torch
from conftest import fisher_blocks
from tiny_llms import lm_batch, tiny_llama

from headprune.core.ffn.gates import FFNGates
from headprune.core.units import unit_gates
from headprune.selection.rearrange import rearrange_mask
from headprune.selection.unit_rearrange import example_gradients, fisher_blocks_of, rearrange_ffn_mask, rearrange_unit_mask


def _mask(groups, seed=0, keep=0.5):
    gen = torch.Generator().manual_seed(seed)
    return {g: (torch.rand(layers, units, generator=gen) < keep).float() for g, (layers, units) in groups.items()}


@pytest.mark.parametrize("attention", ["head", "kv_group"])
def test_joint_rearrangement_is_each_kind_rearranged_by_its_own_rule(attention):
    """rearrange_unit_mask on a joint mask == rearrange_mask on the attention part (Fisher blocks of the attention gates
    alone) beside rearrange_ffn_mask on the neuron part (gradients of FFN gates alone)."""
    model, batches = tiny_llama(), [lm_batch(), lm_batch(seed=1)]
    unit = f"{attention}+ffn"
    gates = unit_gates(model, unit)
    mask = _mask(gates.groups)
    mask["dec_self"][:, 0] = 1.0  # every layer keeps a unit of each kind and loses another
    mask["dec_self"][:, 1] = 0.0
    grads = example_gradients(model, gates, batches, unit=unit)
    done = rearrange_unit_mask(mask, grads, unit)

    alone = unit_gates(model, attention)
    blocks = fisher_blocks(model, alone, batches, unit=attention)
    torch.testing.assert_close(fisher_blocks_of(grads["dec_self"]), blocks["dec_self"], rtol=1e-9, atol=1e-12)
    heads = rearrange_mask({"dec_self": mask["dec_self"]}, blocks)
    neurons = rearrange_ffn_mask({"dec_ffn": mask["dec_ffn"]}, example_gradients(model, FFNGates(model), batches, unit="ffn"))
    assert torch.equal(done.mask["dec_self"], heads.mask["dec_self"]) and torch.equal(done.mask["dec_ffn"], neurons.mask["dec_ffn"])
    for part, group in ((heads, "dec_self"), (neurons, "dec_ffn")):
        torch.testing.assert_close(done.after[group], part.after[group], rtol=1e-9, atol=1e-12)
        assert torch.equal(done.mask[group].sum(-1), mask[group].sum(-1))
    assert done.layers_changed == heads.layers_changed + neurons.layers_changed


def test_a_block_unit_has_no_rearrangement():
    model = tiny_llama()
    gates = unit_gates(model, "block")
    with pytest.raises(ValueError, match="nothing to re-choose"):
        rearrange_unit_mask(gates.ones(), {}, "block")
