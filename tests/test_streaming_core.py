"""Streaming gates: alpha = 0 is attention under an explicit sink + window mask, alpha = 1 the model's own, per-example
masks equal one mask at a time, and gate gradients from one backward equal finite differences and the per-example loop."""

from __future__ import annotations

import sys

import pytest
import torch
from conftest import tiny_bert
from tiny_llms import causal_lm_loss, lm_batch, tiny_family, tiny_llama
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

from headprune.core.attention.gates import HeadGates
from headprune.core.stream_gates import StreamGates
from headprune.core.stream_sites import streaming_keep
from headprune.scoring.importance import fisher_scores, importance_scores, per_example_gate_gradients

SINK, WINDOW = 2, 3
LENGTH = 16  # tokens per text: well beyond sink + window, within the tiny models' 64 positions
REFERENCE = "reference_stream"  # an eager attention function with an explicit per-head streaming mask, written here


def _explicit_keep(queries: int, keys: int) -> torch.Tensor:
    """(Tq, Tk) bool: key j visible from query i of a streamed head, from the definition (no cache: positions 0..T-1)."""
    return torch.tensor([[j <= i and (j < SINK or i - j < WINDOW) for j in range(keys)] for i in range(queries)])


def _reference_attention(module, query, key, value, attention_mask, **kwargs):
    """The module's own eager attention with the heads in ``module._streamed`` (bool (H,)) under the explicit mask."""
    eager = sys.modules[type(module).__module__].eager_attention_forward
    streamed = getattr(module, "_streamed", None)
    if streamed is None:
        return eager(module, query, key, value, attention_mask, **kwargs)
    low = torch.finfo(query.dtype).min
    keep = _explicit_keep(query.shape[-2], key.shape[-2])
    per_head = torch.where(streamed.view(-1, 1, 1), keep, torch.ones_like(keep))  # (H, Tq, Tk)
    own = torch.zeros((), dtype=query.dtype) if attention_mask is None else attention_mask[..., : key.shape[-2]]
    own = torch.where(own, 0.0, low).to(query.dtype) if own.dtype == torch.bool else own
    return eager(module, query, key, value, torch.where(per_head.unsqueeze(0), own, low), **kwargs)


AttentionInterface.register(REFERENCE, _reference_attention)
AttentionMaskInterface.register(REFERENCE, ALL_MASK_ATTENTION_FUNCTIONS["eager"])

MODELS = {
    "llama_gqa_sdpa": lambda: tiny_llama(),  # 4 query heads over 2 KV heads: unit kv_group
    "llama_mha_eager": lambda: tiny_llama(kv_heads=4, attn="eager"),  # one KV head per query head: unit head
    "gemma2_eager": lambda: tiny_family("gemma2", attn="eager"),  # soft-capping, sliding-window layers of 4
    "gemma3_sdpa": lambda: tiny_family("gemma3_text"),
}


def _batch(seed: int = 0) -> dict:
    return lm_batch(seed=seed, batch=3, length=LENGTH)


def _logits(model, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _assert_scaled(actual: torch.Tensor, expected: torch.Tensor, batch: dict, rel: float = 1e-5) -> None:
    """Equal within ``rel`` of the output scale, at the positions that are text (padding queries are nobody's output)."""
    valid = batch["attention_mask"].bool()
    gap = (actual - expected)[valid].abs().max()
    assert gap <= rel * expected[valid].abs().max(), f"max gap {gap:.3g} at scale {expected[valid].abs().max():.3g}"


def _reference_model(name: str, alphas: torch.Tensor, per_kv: int):
    """A fresh copy of model ``name`` whose units with alpha 0 ([L, U]) attend under the explicit mask."""
    model = MODELS[name]()
    model.set_attn_implementation(REFERENCE)
    for layer, block in enumerate(model.model.layers):
        block.self_attn._streamed = (alphas[layer] == 0).repeat_interleave(per_kv)
    return model


@pytest.mark.parametrize("name", list(MODELS))
def test_streamed_units_equal_attention_under_an_explicit_mask(name):
    model = MODELS[name]()
    gates = StreamGates(model, SINK, WINDOW)
    layers, units = gates.groups["dec_self"]
    per_kv = gates.heads_per_kv["dec_self"] if gates.unit == "kv_group" else 1
    assert gates.unit == ("head" if name == "llama_mha_eager" else "kv_group")
    batch = _batch()
    everything = torch.zeros(layers, units)
    some = torch.ones(layers, units)
    some[0, 0] = some[1, units - 1] = some[2, 0] = 0
    for alphas in (everything, some):
        with gates.masked({"dec_self": alphas}):
            gated = _logits(model, batch)
        _assert_scaled(gated, _logits(_reference_model(name, alphas, per_kv), batch), batch)
    unstreamed = _logits(_reference_model(name, torch.ones(layers, units), per_kv), batch)
    assert (gated - unstreamed)[batch["attention_mask"].bool()].abs().max() > 1e-3  # streaming does change the output


@pytest.mark.parametrize("name", ["llama_gqa_sdpa", "gemma2_eager"])
def test_alpha_one_is_the_model_and_no_gate_costs_nothing(name, monkeypatch):
    model = MODELS[name]()
    batch = _batch()
    own = _logits(model, batch)
    gates = StreamGates(model, SINK, WINDOW)
    with gates.masked(gates.ones()):
        _assert_scaled(_logits(model, batch), own, batch, rel=1e-6)
    calls = []
    monkeypatch.setattr(type(gates.sites[0]), "mix", lambda *a, **k: calls.append(1))
    assert torch.equal(_logits(model, batch), own) and not calls  # no gate set: the streaming branch never runs
    gates.remove()
    assert all(site.stream is None for site in HeadGates(model).sites)


def test_keep_mask_follows_the_definition():
    positions = torch.arange(20)
    assert torch.equal(streaming_keep(positions, positions, SINK, WINDOW), _explicit_keep(20, 20))
    assert int(streaming_keep(positions, positions, 4, 8).sum(1).max()) == 12  # sink 4 + window 8: at most 12 keys


def test_per_example_gates_equal_one_mask_at_a_time():
    model = tiny_llama()
    gates = StreamGates(model, SINK, WINDOW)
    batch = _batch()
    alphas = torch.rand(3, *gates.groups["dec_self"], generator=torch.Generator().manual_seed(1))
    alphas[0] = 0
    with gates.masked({"dec_self": alphas}):
        together = _logits(model, batch)
    for row in range(3):
        with gates.masked({"dec_self": alphas[row]}):
            alone = _logits(model, batch)[row]
        _assert_scaled(together[row : row + 1], alone[None], {"attention_mask": batch["attention_mask"][row : row + 1]}, rel=1e-6)


def _single(batch: dict, row: int) -> dict:
    length = int(batch["attention_mask"][row].sum())
    return {k: v[row : row + 1, :length] for k, v in batch.items()}


@pytest.mark.parametrize("name", ["llama_gqa_sdpa", "llama_mha_eager"])
def test_gate_gradient_from_one_backward_equals_autograd_and_finite_differences(name):
    model = MODELS[name]().double()
    gates = StreamGates(model, SINK, WINDOW)
    batch = _batch()
    grads = per_example_gate_gradients(model, gates, batch, loss_fn=causal_lm_loss, unit=gates.unit)["dec_self"]  # (B, L, U)

    def losses(alphas):
        with gates.masked({"dec_self": alphas}):
            return causal_lm_loss(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]), batch)

    alphas = gates.ones()["dec_self"].double().requires_grad_()
    per_example = losses(alphas)
    for row in range(3):  # the gradient through the gate tensor itself, one example at a time
        direct = torch.autograd.grad(per_example[row], alphas, retain_graph=True)[0]
        torch.testing.assert_close(grads[row], direct, atol=1e-12, rtol=1e-9)
    # central differences: the models' RMS norms run in float32, which bounds their accuracy to about 1e-4 at this step
    eps = 3e-3
    for layer, unit in [(0, 1), (1, 0), (2, 1)]:
        changed = [gates.ones()["dec_self"].double() for _ in range(2)]
        changed[0][layer, unit], changed[1][layer, unit] = 1 + eps, 1 - eps
        with torch.no_grad():
            finite = (losses(changed[0]) - losses(changed[1])) / (2 * eps)
        scale = finite.abs().max()
        assert scale > 1e-4  # the unit matters to the loss
        assert (grads[:, layer, unit] - finite).abs().max() <= 2e-3 * scale


def test_importance_and_fisher_equal_the_per_example_loop():
    model = tiny_llama(dtype=torch.float64)
    gates = StreamGates(model, SINK, WINDOW)
    batches = [_batch(seed) for seed in range(2)]
    singles = [_single(b, r) for b in batches for r in range(3)]
    loop = [per_example_gate_gradients(model, gates, one, loss_fn=causal_lm_loss, unit=gates.unit)["dec_self"][0] for one in singles]
    importance = importance_scores(model, gates, batches, loss_fn=causal_lm_loss, normalize_layers=False, unit=gates.unit)["dec_self"]
    fisher = fisher_scores(model, gates, batches, loss_fn=causal_lm_loss, unit=gates.unit)["dec_self"]
    torch.testing.assert_close(importance.double(), sum(g.abs() for g in loop) / len(loop), atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(fisher.double(), sum(g**2 for g in loop) / len(loop), atol=1e-9, rtol=1e-5)
    assert importance.shape == gates.groups["dec_self"]


def test_an_encoder_is_refused():
    with pytest.raises(ValueError, match="no causal self-attention.*caches nothing"):
        StreamGates(tiny_bert(), SINK, WINDOW)


def test_bad_units_and_spans_are_refused():
    with pytest.raises(ValueError, match="kv_group needs grouped-query attention"):
        StreamGates(tiny_llama(kv_heads=4), SINK, WINDOW, unit="kv_group")
    with pytest.raises(ValueError, match="window"):
        StreamGates(tiny_llama(), SINK, 0)
    with pytest.raises(ValueError, match="sink"):
        StreamGates(tiny_llama(), -1, WINDOW)
    head_unit = StreamGates(tiny_llama(), SINK, WINDOW, unit="head")  # a query head alone can stream (the cache needs whole groups)
    assert head_unit.groups == {"dec_self": (3, 4)}


def test_a_streaming_mask_is_no_pruning_mask():
    from headprune.core.units import prune_unit_mask

    gates = StreamGates(tiny_llama(), SINK, WINDOW)
    with pytest.raises(ValueError, match="keeps every weight"):
        prune_unit_mask(gates, gates.ones())


def test_the_batched_ablation_engine_equals_the_loop_of_streaming_masks():
    from mask_references import looped_nll

    from headprune.engine.ablation import single_unit_masks
    from headprune.engine.ablation_causal import CausalMaskBatcher

    model = tiny_llama()
    gates = StreamGates(model, SINK, WINDOW)
    masks, _ = single_unit_masks(gates.groups, unit=gates.unit)  # one KV group streamed at a time
    masks += [None, {"dec_self": torch.rand(*gates.groups["dec_self"], generator=torch.Generator().manual_seed(2))}]
    batch = _batch()
    batched = CausalMaskBatcher(model, gates).nll(batch, masks)
    looped = looped_nll(model, gates, batch, masks)
    assert (batched - looped).abs().max() <= 1e-5 * looped.abs().max()
    assert (looped[:-2] - looped[-2]).abs().min() > 1e-4  # streaming any one group changes the loss


def test_an_attention_without_4d_masks_is_refused():
    model = tiny_llama()
    model.config._attn_implementation_internal = "flex_attention"  # as loaded with it (not run here)
    with pytest.raises(ValueError, match="attn_implementation one of"):
        StreamGates(model, SINK, WINDOW)
