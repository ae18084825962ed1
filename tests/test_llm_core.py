"""Llama-family models with grouped KV heads: gates, KV-group masks and importance, physical pruning, generation."""

import pytest
import torch
from tiny_llms import causal_lm_loss, lm_batch, tiny_decoder, tiny_llama, tiny_qwen2

from headprune.core.attention.gates import HeadGates
from headprune.core.masks import kv_to_head_mask
from headprune.core.pruning import prune_heads, prune_mask, pruning_record
from headprune.core.saving import load_pruned, save_pruned
from headprune.scoring.importance import attention_entropy, importance_scores, per_example_gate_gradients


def _logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _llama_masks():
    """Query-head masks [3 layers, 4 heads] over 2 KV heads: uneven groups, whole KV groups, emptied layers."""
    uneven = torch.tensor([[1, 0, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0]])  # KV 0 keeps 1 head, KV 1 keeps 2; KV 1 gone; empty
    kv_groups = kv_to_head_mask({"dec_self": torch.tensor([[1, 0], [0, 1], [1, 1]])}, {"dec_self": 2})["dec_self"]
    odd = torch.tensor([[0, 1, 1, 0], [1, 1, 1, 0], [1, 0, 0, 1]])  # one head per KV head (even again), then 2 + 1
    everything = torch.zeros(3, 4)
    return [{"dec_self": m.float()} for m in (uneven, kv_groups, odd, everything)]


def _qwen_masks():
    """Query-head masks [2 layers, 6 heads] over 2 KV heads of 3."""
    gen = torch.Generator().manual_seed(4)
    masks = [{"dec_self": torch.tensor([[1, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 0]]).float()}]
    masks += [{"dec_self": (torch.rand(2, 6, generator=gen) > 0.5).float()} for _ in range(3)]
    return masks


def test_family_row_and_kv_structure():
    gates = HeadGates(tiny_qwen2())
    assert gates.groups == {"dec_self": (2, 6)}
    assert gates.kv_groups == {"dec_self": (2, 2)}
    assert gates.heads_per_kv == {"dec_self": 3}
    assert [gates.site("dec_self", 1).kv_of(h) for h in range(6)] == [0, 0, 0, 1, 1, 1]
    assert "kv_heads/layer=2" in gates.describe()


def test_unsupported_model_type_lists_the_supported():
    from transformers import BloomConfig, BloomForCausalLM

    with pytest.raises(ValueError, match=r"does not support model type 'bloom'.*gpt2.*llama.*mistral.*qwen2.*qwen3"):
        HeadGates(BloomForCausalLM(BloomConfig(n_layer=1, n_head=2, hidden_size=8, vocab_size=10)))


@pytest.mark.parametrize("make", [tiny_llama, tiny_qwen2])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_gates_at_one_equal_plain_model(make, attn):
    model = make(attn=attn)
    batch = lm_batch()
    plain = _logits(model, batch)
    gates = HeadGates(model)
    gates.set_mask(gates.ones())
    torch.testing.assert_close(_logits(model, batch), plain, atol=1e-6, rtol=0)


def test_a_kv_mask_converts_to_its_query_heads():
    kv = {"dec_self": torch.tensor([[1.0, 0.0], [0.0, 1.0]])}
    heads = kv_to_head_mask(kv, {"dec_self": 3})
    assert heads["dec_self"].tolist() == [[1, 1, 1, 0, 0, 0], [0, 0, 0, 1, 1, 1]]


@pytest.mark.parametrize("make,masks", [(tiny_llama, _llama_masks), (tiny_qwen2, _qwen_masks)])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_pruned_equals_masked_and_survives_save_load(tmp_path, make, masks, attn):
    model = make(attn=attn)
    gates = HeadGates(model)
    batch = lm_batch()
    for number, mask in enumerate(masks()):
        with gates.masked(mask):
            masked = _logits(model, batch)
        pruned = make(attn=attn)  # a fresh, never gated model: pruning alone must make it run
        prune_mask(pruned, mask)
        torch.testing.assert_close(_logits(pruned, batch), masked, atol=1e-5, rtol=0)
        save_pruned(pruned, tmp_path / f"m{number}")
        reloaded = load_pruned(tmp_path / f"m{number}")
        torch.testing.assert_close(_logits(reloaded, batch), masked, atol=1e-5, rtol=0)
        assert pruning_record(reloaded) == pruning_record(pruned)


def test_kv_heads_leave_with_their_last_query_head():
    model = tiny_llama()
    gates = HeadGates(model)
    prune_heads(model, {"dec_self": {0: [0], 1: [0, 1], 2: [0, 1, 2, 3]}})
    attn = [model.model.layers[i].self_attn for i in range(3)]
    assert [a.q_proj.out_features // 8 for a in attn] == [3, 2, 1]  # the emptied layer keeps a phantom head
    assert [a.k_proj.out_features // 8 for a in attn] == [2, 1, 1]
    assert [a.v_proj.out_features // 8 for a in attn] == [2, 1, 1]
    assert [s.kv_ids for s in gates.sites] == [[0, 1], [1], []]
    assert [a.num_key_value_groups for a in attn] == [1, 2, 1]  # layer 0 uneven (1 + 2): mapped per query head
    assert gates.sites[0].kv_index.tolist() == [0, 1, 1]
    assert gates.sites[1].kv_index is None  # one full group left: the model's own expansion
    batch = lm_batch()
    before = _logits(model, batch)
    gates.remove()  # uneven groups still need the wrapper's KV mapping: it stays
    torch.testing.assert_close(_logits(model, batch), before, atol=0, rtol=0)


@pytest.mark.parametrize("make,mask", [(tiny_llama, _llama_masks()[0]), (tiny_qwen2, _qwen_masks()[0])])
def test_greedy_generation_with_cache_pruned_equals_gated(tmp_path, make, mask):
    model = make()
    gates = HeadGates(model)
    batch = lm_batch(left_pad=True)
    kwargs = dict(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        max_new_tokens=6,
        do_sample=False,
        use_cache=True,
        pad_token_id=0,
    )
    with gates.masked(mask):
        gated = model.generate(**kwargs)
    pruned = make()
    prune_mask(pruned, mask)
    assert torch.equal(pruned.generate(**kwargs), gated)
    save_pruned(pruned, tmp_path / "model")
    assert torch.equal(load_pruned(tmp_path / "model").generate(**kwargs), gated)


def test_entropy_of_present_heads_pruned_equals_masked():
    model = tiny_llama()
    gates = HeadGates(model)
    mask = _llama_masks()[0]
    batch = {k: v for k, v in lm_batch().items() if k != "labels"}
    with gates.masked(mask):
        masked = attention_entropy(model, gates, [batch])["dec_self"]
    pruned = tiny_llama()
    prune_mask(pruned, mask)
    entropy = attention_entropy(pruned, HeadGates(pruned), [batch])["dec_self"]
    present = mask["dec_self"].bool()
    torch.testing.assert_close(entropy[present], masked[present], atol=1e-5, rtol=0)
    assert torch.all(entropy[~present] == 0)


@pytest.mark.parametrize("unit", ["head", "kv_group"])
def test_per_example_gradients_equal_single_example_loop(unit):
    model = tiny_qwen2()
    gates = HeadGates(model)
    batch = lm_batch(batch=3)
    together = per_example_gate_gradients(model, gates, batch, loss_fn=causal_lm_loss, unit=unit)["dec_self"]
    for row in range(3):
        single = {k: v[row : row + 1] for k, v in batch.items()}
        alone = per_example_gate_gradients(model, gates, single, loss_fn=causal_lm_loss, unit=unit)["dec_self"]
        torch.testing.assert_close(together[row], alone[0], atol=1e-6, rtol=1e-4)


def test_kv_group_importance_is_the_gradient_of_a_shared_gate():
    model = tiny_qwen2()
    gates = HeadGates(model)
    batch = lm_batch(batch=3)
    prune_heads(model, {"dec_self": {0: [4]}})  # uneven groups in layer 0 too
    shared = torch.ones(3, 2, 2, dtype=torch.float32, requires_grad=True)  # (B, L, KV): one gate per example and KV group
    with gates.masked(kv_to_head_mask({"dec_self": shared}, gates.heads_per_kv)), torch.enable_grad():
        causal_lm_loss(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]), batch).sum().backward()
    direct = shared.grad.double()
    probed = per_example_gate_gradients(model, gates, batch, loss_fn=causal_lm_loss, unit="kv_group")["dec_self"]
    torch.testing.assert_close(probed, direct, atol=1e-6, rtol=1e-4)
    scores = importance_scores(model, gates, [batch], loss_fn=causal_lm_loss, unit="kv_group", normalize_layers=False)
    torch.testing.assert_close(scores["dec_self"].double(), direct.abs().mean(0), atol=1e-6, rtol=1e-4)


def test_kv_cache_bytes_per_token_match_the_cache_of_a_forward():
    from transformers import DynamicCache

    from headprune.core.counting import kv_cache_bytes_per_token

    model = tiny_llama()
    prune_heads(model, {"dec_self": {0: [0, 1], 2: [0, 1, 2, 3]}})  # KV head 0 of layer 0 goes; layer 2 keeps a phantom
    cache = DynamicCache(config=model.config)
    batch = lm_batch(batch=1)
    with torch.no_grad():
        model(input_ids=batch["input_ids"], past_key_values=cache, use_cache=True)
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    tokens = batch["input_ids"].shape[1]
    assert kv_cache_bytes_per_token(model) * tokens == held
    assert kv_cache_bytes_per_token(model) == 2 * (1 + 2 + 1) * 8 * 4
    assert kv_cache_bytes_per_token(model, ideal=True) == 2 * (1 + 2 + 0) * 8 * 4


def test_entropy_counts_every_real_token_of_a_decoder_only_model():
    model = tiny_llama(layers=1, attn="eager")  # eager returns the attention probabilities
    gates = HeadGates(model)
    batch = lm_batch(batch=2)
    entropy = attention_entropy(model, gates, [batch])["dec_self"][0]
    with torch.no_grad():  # by hand: mean over real query tokens of the entropy of each head's attention row
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_attentions=True)
    probs = out.attentions[0]  # (B, H, T, T)
    rows = -(probs * probs.clamp(min=1e-30).log()).sum(-1)  # (B, H, T)
    valid = batch["attention_mask"].unsqueeze(1).float()
    torch.testing.assert_close(entropy, ((rows * valid).sum((0, 2)) / valid.sum((0, 2))).float(), atol=1e-5, rtol=0)


def test_prune_kv_groups_equals_the_query_head_mask():
    from headprune.core.pruning import prune_kv_groups

    by_groups, by_mask = tiny_qwen2(), tiny_qwen2()
    record = prune_kv_groups(by_groups, {"dec_self": {0: [1], 1: [0, 1]}})
    kv_mask = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert record == prune_mask(by_mask, kv_to_head_mask({"dec_self": kv_mask}, {"dec_self": 3}))
    assert record == {"dec_self": {"0": [3, 4, 5], "1": [0, 1, 2, 3, 4, 5]}}
    batch = lm_batch()
    torch.testing.assert_close(_logits(by_groups, batch), _logits(by_mask, batch), atol=0, rtol=0)
    with pytest.raises(IndexError, match=r"KV head ids \[2\] out of range for dec_self layer 0 \(2 KV heads\)"):
        prune_kv_groups(tiny_qwen2(), {"dec_self": {0: [2]}})


@pytest.mark.parametrize("model_type", ["mistral", "qwen3"])
def test_other_llama_like_types_prune_like_their_masks(model_type):
    model = tiny_decoder(model_type)
    gates = HeadGates(model)
    assert type(model).__name__.lower().startswith(model_type) and gates.kv_groups == {"dec_self": (2, 2)}
    batch = lm_batch()
    plain = _logits(model, batch)
    gates.set_mask(gates.ones())
    torch.testing.assert_close(_logits(model, batch), plain, atol=1e-6, rtol=0)
    mask = {"dec_self": torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])}
    with gates.masked(mask):
        masked = _logits(model, batch)
    pruned = tiny_decoder(model_type)
    prune_mask(pruned, mask)
    torch.testing.assert_close(_logits(pruned, batch), masked, atol=1e-5, rtol=0)
