"""The batched engine for causal LMs equals evaluating every mask on its own (per-text NLL, allclose)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from experiment_helpers import compose_cfg
from mask_references import looped_nll
from tiny_llms import lm_batch, tiny_decoder, tiny_llama, tiny_qwen2

from headprune.core.attention.gates import HeadGates
from headprune.core.attention.kv_groups import KVGroupGates
from headprune.engine.ablation import keep_one_masks, single_unit_masks
from headprune.engine.ablation_causal import CausalMaskBatcher, batchable, length_groups, needed_lengths

LM = [
    "experiment=ablate",
    "model=tiny_llama",
    "data=lm_synthetic",
    "data.synthetic.sizes.eval=20",
    "data.synthetic.sizes.importance=20",
    "data.synthetic.sizes.heldout=4",
    "data.eval_batch_size=8",
    "logger=none",
]


def _batch(left_pad: bool = False) -> dict:
    """Six texts of uneven lengths (padding, one text of two tokens) with next-token labels, -100 where none."""
    batch = lm_batch(seed=1, batch=6, length=11, left_pad=left_pad)
    mask = batch["attention_mask"]
    if not left_pad:
        mask[5, 2:] = 0  # a text of two tokens: one predicted token
    batch["input_ids"] = batch["input_ids"].masked_fill(mask == 0, 0)
    nxt = torch.cat([batch["input_ids"][:, 1:], torch.zeros(6, 1, dtype=torch.long)], 1)
    valid = torch.cat([mask[:, 1:], torch.zeros(6, 1, dtype=torch.long)], 1) * mask
    batch["labels"] = nxt.masked_fill(valid == 0, -100)
    return batch


def _masks(gates: HeadGates) -> list:
    """Every single head, every single KV group, keep-one of the last layer, a mixed mask and keep-all."""
    heads, _ = single_unit_masks(gates.groups)
    kv = KVGroupGates(gates)
    groups, _ = single_unit_masks(kv.groups)
    layers, n = gates.groups["dec_self"]
    mixed = gates.ones()
    mixed["dec_self"][1, 0] = 0.0
    mixed["dec_self"][layers - 1, 1:] = 0.5
    return heads + [kv.head_mask(g) for g in groups] + keep_one_masks(gates.groups, "dec_self", layers - 1) + [mixed, gates.ones()]


@pytest.mark.parametrize(
    "build,attn", [(tiny_llama, "sdpa"), (tiny_llama, "eager"), (tiny_qwen2, "sdpa"), (lambda attn: tiny_decoder("qwen3"), "sdpa")]
)
def test_batched_equals_looped(build, attn):
    model = build(attn=attn)
    gates = HeadGates(model)
    batch = _batch()
    masks = _masks(gates)
    engine = CausalMaskBatcher(model, gates, max_tokens=90, head_tokens=7, pass_tokens=4)  # several passes and head chunks
    batched = engine.nll(batch, masks)
    looped = looped_nll(model, gates, batch, masks)
    assert batched.shape == (len(masks), 6) and batched.dtype == torch.float64
    torch.testing.assert_close(batched, looped, atol=1e-5, rtol=1e-5)
    # masks at the first and the last layer change the NLL; keep-all equals the plain model
    layers, heads = gates.groups["dec_self"]
    assert not torch.allclose(batched[0], batched[-1]) and not torch.allclose(batched[layers * heads - 1], batched[-1])
    with torch.inference_mode():
        plain = looped_nll(model, gates, batch, [None])[0]
    torch.testing.assert_close(plain, looped[-1], atol=1e-6, rtol=1e-6)  # the engine left the model as it found it
    assert model.config._attn_implementation.startswith("headprune_") and all(s.gate is None for s in gates.sites)


def test_pruned_model_with_uneven_kv_groups_and_an_emptied_layer():
    from headprune.core.pruning import prune_heads

    model = tiny_llama(attn="sdpa")
    prune_heads(model, {"dec_self": {0: [1], 1: [0, 1], 2: [0, 1, 2, 3]}})  # layer 0 uneven, layer 2 empty (a phantom)
    gates = HeadGates(model)
    batch = _batch()
    masks = _masks(gates)
    torch.testing.assert_close(
        CausalMaskBatcher(model, gates, max_tokens=90).nll(batch, masks), looped_nll(model, gates, batch, masks), atol=1e-5, rtol=1e-5
    )


def test_left_padding_and_a_text_without_labels():
    model = tiny_llama()
    gates = HeadGates(model)
    batch = _batch(left_pad=True)
    batch["labels"][2] = -100  # nothing to predict: NLL 0, no pass
    assert needed_lengths(batch["labels"]) == [10, 10, 0, 10, 10, 10]  # up to the last label: never the last token
    masks = _masks(gates)[:6] + [gates.ones()]
    batched = CausalMaskBatcher(model, gates).nll(batch, masks)
    torch.testing.assert_close(batched, looped_nll(model, gates, batch, masks), atol=1e-5, rtol=1e-5)
    assert (batched[:, 2] == 0).all()


def test_length_groups_partition_rows_by_length():
    lengths = [3, 9, 9, 2, 8, 3]
    labels = torch.tensor([[5] * (n - 1) + [-100] * (10 - n) for n in lengths])  # a text of n tokens predicts n - 1
    assert needed_lengths(labels) == [n - 1 for n in lengths]
    for pass_tokens in (0, 5, 1000):
        groups = length_groups(lengths, copies=3, pass_tokens=pass_tokens)
        assert sorted(r for g in groups for r in g) == list(range(len(lengths)))
        longest = [max(lengths[r] for r in g) for g in groups]
        assert longest == sorted(longest, reverse=True)
    assert length_groups(lengths, 3, 1000) == [[1, 2, 4, 0, 5, 3]]  # a costly pass: one group
    assert [sorted(lengths[r] for r in g) for g in length_groups(lengths, 3, 0)] == [[9, 9], [8], [3, 3], [2]]


def test_batchable_and_errors():
    model = tiny_llama()
    gates = HeadGates(model)
    assert batchable(gates, [None, gates.ones()])
    assert not batchable(gates, [{"dec_self": torch.ones(4, 3, 4)}])  # one mask per example: the plain path
    with pytest.raises(ValueError, match="shape"):
        CausalMaskBatcher(model, gates).nll(_batch(), [{"dec_self": torch.ones(2, 4)}])
    with pytest.raises(ValueError, match="no masks"):
        CausalMaskBatcher(model, gates).nll(_batch(), [])
    with pytest.raises(ValueError, match="not a causal LM"):
        bare = tiny_llama().model  # the decoder stack without its LM head
        CausalMaskBatcher(bare, HeadGates(bare))


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from headprune.tasks.registry import load_task

    torch.set_num_threads(1)
    return load_task(compose_cfg(tmp_path_factory.mktemp("lm"), LM))


@pytest.mark.parametrize("unit", ["head", "kv_group"])
def test_task_evaluate_many_uses_the_engine(task, unit, monkeypatch):
    from headprune.tasks.unit_task import in_unit

    seen = []
    monkeypatch.setattr(CausalMaskBatcher, "nll", lambda self, *a, **k: _spy(seen, self, *a, **k))
    unit_task = in_unit(task, unit)
    masks, _ = single_unit_masks(unit_task.gates.groups)
    masks.append(None)
    batched = unit_task.evaluate_many(masks)
    assert seen  # the engine ran
    plain = task.evaluate_many([None if m is None else unit_task.gates.head_mask(m) for m in masks], batched=False)
    for one, other in zip(batched, plain):
        np.testing.assert_allclose(one.per_example["nll"], other.per_example["nll"], atol=1e-5, rtol=1e-5)
        assert one.per_example["tokens"] == other.per_example["tokens"]
        assert one.score == pytest.approx(other.score, rel=1e-6)


_ENGINE_NLL = CausalMaskBatcher.nll


def _spy(seen: list, engine, *args, **kwargs):
    seen.append(1)
    return _ENGINE_NLL(engine, *args, **kwargs)
