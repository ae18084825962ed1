"""The batched multi-mask engines take masks of every unit: FFN neurons, heads + neurons, KV groups + neurons, whole blocks.

Batched passes equal one plain forward per mask (allclose), for an encoder classifier and a causal LM.
"""

from __future__ import annotations

import pytest
import torch
from conftest import classifier_batch, tiny_bert
from mask_references import looped_mask_logits, looped_nll
from tiny_llms import lm_batch, tiny_llama

from headprune.core.attention.gates import HeadGates
from headprune.core.units import unit_gates
from headprune.engine.ablation import MaskBatcher, single_unit_masks
from headprune.engine.ablation_causal import CausalMaskBatcher, batchable


def _masks(gates, seed: int = 0) -> list:
    """Masks changing first at every layer: one unit, a random half of a layer (0.5 gates too), an emptied layer, keep-all."""
    gen = torch.Generator().manual_seed(seed)
    masks = []
    for group, (layers, units) in gates.groups.items():
        for layer in range(layers):
            one = gates.ones()
            one[group][layer, units - 1] = 0
            half = gates.ones()
            half[group][layer] = (torch.rand(units, generator=gen) < 0.5).float() * 0.5 + 0.5 * (torch.rand(units, generator=gen) < 0.5)
            empty = gates.ones()
            empty[group][layer] = 0
            masks += [one, half, empty]
    return masks + [gates.ones(), None]


def _causal_batch() -> dict:
    batch = lm_batch(seed=1, batch=4, length=10)
    labels = torch.cat([batch["input_ids"][:, 1:], torch.zeros(4, 1, dtype=torch.long)], 1)
    valid = torch.cat([batch["attention_mask"][:, 1:], torch.zeros(4, 1, dtype=torch.long)], 1)
    batch["labels"] = labels.masked_fill(valid == 0, -100)
    return batch


@pytest.mark.parametrize("unit", ["ffn", "head+ffn", "block"])
def test_encoder_engine_equals_one_pass_per_mask(unit):
    model = tiny_bert()
    gates = unit_gates(model, unit)
    batch = {k: v for k, v in classifier_batch(batch=5).items() if k != "labels"}
    masks = _masks(gates)
    batched = MaskBatcher(model, gates, max_rows=12).logits(batch, masks)  # several chunks; first-token cut checked
    looped = looped_mask_logits(model, gates, batch, [m if m is not None else gates.ones() for m in masks])
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)
    assert all(s.gate is None for s in gates.sites)  # the engine leaves the gates as it found them


@pytest.mark.parametrize("unit", ["ffn", "head+ffn", "kv_group+ffn", "block"])
def test_causal_engine_equals_one_pass_per_mask(unit):
    model = tiny_llama()
    gates = unit_gates(model, unit)
    batch = _causal_batch()
    masks = _masks(gates)
    assert batchable(gates, masks)
    batched = CausalMaskBatcher(model, gates, max_tokens=60, head_tokens=7, pass_tokens=4).nll(batch, masks)
    looped = looped_nll(model, gates, batch, [m if m is not None else gates.ones() for m in masks])
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)
    with torch.inference_mode():
        plain = looped_nll(model, HeadGates(model), batch, [None])[0]
    torch.testing.assert_close(plain, batched[-1], atol=1e-6, rtol=1e-6)


def test_per_example_masks_and_other_groups_are_refused():
    model = tiny_llama()
    gates = unit_gates(model, "ffn")
    per_example = {"dec_ffn": torch.ones(4, 3, 64)}
    assert not batchable(gates, [per_example])
    with pytest.raises(ValueError, match="not one per example"):
        CausalMaskBatcher(model, gates).nll(_causal_batch(), [per_example])
    with pytest.raises(ValueError, match="encoder-only classifiers"):
        MaskBatcher(model, gates)


def test_single_neuron_ablation_is_refused_with_its_reason():
    gates = unit_gates(tiny_llama(), "head+ffn")
    with pytest.raises(ValueError, match="no useful pruning order.*prune.order=importance or fisher"):
        single_unit_masks(gates.groups, unit=gates.unit)
    blocks = unit_gates(gates, "block")
    masks, units = single_unit_masks(blocks.groups, unit="block")  # dropping one block at a time is an order
    assert len(masks) == 6 and units[0] == ("dec_self_block", 0, 0)
