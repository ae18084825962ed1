"""The streaming cache: generation with it equals the gated model's with the full cache, and it holds the analytic bytes."""

from __future__ import annotations

import pytest
import torch
from tiny_llms import lm_batch, tiny_family, tiny_llama

from headprune.core.counting import kv_cache_bytes_per_token
from headprune.core.stream_cache import StreamCache, held_kv_bytes, stream_cache_bytes
from headprune.core.stream_gates import StreamGates

SINK, WINDOW = 2, 3
PROMPT, NEW = 10, 12  # prompt tokens and generated ones: well past sink + window, within the tiny models' 64 positions

MODELS = {
    "llama_gqa_sdpa": lambda: tiny_llama(),  # 3 layers, 4 query heads over 2 KV heads
    "llama_mha_eager": lambda: tiny_llama(kv_heads=4, attn="eager"),
    "gemma3_sdpa": lambda: tiny_family("gemma3_text"),  # sliding-window layers 0 and 2 (window 4), full layer 1
    "gemma2_eager": lambda: tiny_family("gemma2", attn="eager"),
}


def _mask(gates) -> dict:
    """Layer 0 streams its first unit, layer 1 every unit, layer 2 none."""
    mask = gates.ones()["dec_self"]
    mask[0, 0] = 0
    mask[1] = 0
    return {"dec_self": mask}


def _prompts(batch: int) -> dict:
    prompts = lm_batch(seed=3, batch=batch, length=PROMPT, left_pad=True)
    return {"input_ids": prompts["input_ids"], "attention_mask": prompts["attention_mask"]}


def _generate(model, prompts: dict, **kwargs):
    with torch.no_grad():
        return model.generate(
            **prompts, max_new_tokens=NEW, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True, **kwargs
        )


def _assert_same_generation(streamed, gated) -> None:
    assert torch.equal(streamed.sequences, gated.sequences)
    got, expected = torch.stack(streamed.logits), torch.stack(gated.logits)
    assert (got - expected).abs().max() <= 1e-5 * expected.abs().max()


@pytest.mark.parametrize("batch", [1, 3])  # one text (no mask: the kernels' causal flag), left-padded texts (the model's mask)
@pytest.mark.parametrize("name", list(MODELS))
def test_generation_with_the_stream_cache_equals_the_gated_model(name, batch):
    model = MODELS[name]()
    gates = StreamGates(model, SINK, WINDOW)
    mask, prompts = _mask(gates), _prompts(batch)
    with gates.masked(mask):
        gated = _generate(model, prompts)  # the model's own full cache, the streamed units under the mask
    cache = StreamCache(gates, mask)
    _assert_same_generation(_generate(model, prompts, past_key_values=cache), gated)
    tokens = PROMPT + NEW - 1  # the last generated token is never fed back
    assert held_kv_bytes(cache) == stream_cache_bytes(gates, mask, tokens, batch=batch)
    plain = lambda: _generate(model, prompts)  # noqa: E731
    assert not torch.equal(torch.stack(plain().logits), torch.stack(gated.logits))  # streaming changes the model


def test_a_plain_decode_loop_and_the_bytes_at_every_step():
    model = tiny_llama()
    gates = StreamGates(model, SINK, WINDOW)
    mask, prompts = _mask(gates), _prompts(2)
    cache = StreamCache(gates, mask)
    ids, attention = prompts["input_ids"][:, :3], prompts["attention_mask"][:, :3]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache).logits[:, -1]
        for step in range(3, PROMPT + NEW):
            assert held_kv_bytes(cache) == stream_cache_bytes(gates, mask, step, batch=2)  # before and after the buffers fill
            token = logits.argmax(-1, keepdim=True)
            ids, attention = torch.cat([ids, token], 1), torch.cat([attention, torch.ones_like(token)], 1)
            logits = model(input_ids=token, attention_mask=attention, past_key_values=cache).logits[:, -1]
        with gates.masked(mask):
            expected = model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, -1]
    assert (logits - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_nothing_streamed_is_the_full_cache_and_its_bytes():
    model = tiny_llama()
    gates = StreamGates(model, SINK, WINDOW)
    prompts = _prompts(2)
    cache = StreamCache(gates, gates.ones())
    _assert_same_generation(_generate(model, prompts, past_key_values=cache), _generate(model, prompts))
    tokens = PROMPT + NEW - 1
    assert held_kv_bytes(cache) == stream_cache_bytes(gates, gates.ones(), tokens, batch=2) == kv_cache_bytes_per_token(model) * tokens * 2


def test_beam_search_with_the_stream_cache_equals_the_gated_model():
    model = tiny_llama()
    gates = StreamGates(model, SINK, WINDOW)
    mask, prompts = _mask(gates), _prompts(2)
    with gates.masked(mask):
        gated = _generate(model, prompts, num_beams=3, num_return_sequences=2)
    streamed = _generate(model, prompts, num_beams=3, num_return_sequences=2, past_key_values=StreamCache(gates, mask))
    assert torch.equal(streamed.sequences, gated.sequences)


def test_the_gated_model_with_a_sliding_cache_equals_its_uncached_forward():
    model = tiny_family("gemma3_text")  # the sliding layers' cache drops old keys: positions come from the cache
    gates = StreamGates(model, SINK, WINDOW)
    mask, prompts = _mask(gates), _prompts(2)
    with gates.masked(mask), torch.no_grad():
        generated = _generate(model, prompts)
        attention = torch.cat([prompts["attention_mask"], torch.ones(2, NEW - 1, dtype=torch.long)], 1)
        uncached = model(input_ids=generated.sequences[:, :-1], attention_mask=attention, use_cache=False).logits[:, PROMPT - 1 :]
    expected = uncached.transpose(0, 1)
    assert (torch.stack(generated.logits) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_bad_caches_are_refused():
    model = tiny_llama()
    heads = StreamGates(model, SINK, WINDOW, unit="head")
    half = heads.ones()
    half["dec_self"][0, 0] = 0  # one query head of KV group 0
    with pytest.raises(ValueError, match="streamed only in part"):
        StreamCache(heads, half)
    gates = StreamGates(model, SINK, WINDOW)
    with pytest.raises(ValueError, match="one mask"):
        StreamCache(gates, {"dec_self": torch.zeros(2, 3, 2)})
    with pytest.raises(ValueError, match="0 .remove the head. or 1"):
        StreamCache(gates, {"dec_self": torch.full((3, 2), 0.5)})
    cache = StreamCache(gates, _mask(gates))
    with torch.no_grad():
        model(**_prompts(1), past_key_values=cache)
    with pytest.raises(ValueError, match="cannot be cropped"):
        cache.crop(-1)
    stale = StreamCache(gates, _mask(gates))
    gates.remove()
    with pytest.raises(ValueError, match="were removed"), torch.no_grad():
        model(**_prompts(1), past_key_values=stale)
