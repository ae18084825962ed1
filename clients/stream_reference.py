"""Streamed KV groups by an explicit attention mask: the plain definition a streaming export is checked against.

A streamed KV group's query heads at position i attend to keys j <= i with

    headprune (``context=None``):  j < sink  or  i - j < window          (every position, prefill included)
    kvpress   (``context=C``):     i < C  or  j < sink  or  j >= C - window   (full prefill of the C context tokens;
                                                                              later tokens see the sink, the context's
                                                                              last ``window`` tokens and what follows)

other groups attend causally. With a KV cache the queries are the last positions of the keys; the cache holds every
key (the mask hides them), so cached and uncached forwards agree. ``answers`` is the plain reference; ``gated_answers``
(headprune's StreamGates decoding on its StreamCache) takes the same arguments.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NAME = "headprune_stream_reference"


@dataclass(frozen=True)
class StreamMask:
    """Which KV groups stream ((layers, KV heads) bool), their sink and window, and the context length in kvpress's mode."""

    streamed: torch.Tensor
    sink: int
    window: int
    context: int | None = None

    def allowed(self, layer: int, heads: int, queries: int, keys: int) -> torch.Tensor:
        """(heads, queries, keys) bool: True where query i (the last ``queries`` of ``keys`` positions) may attend to key j."""
        i = torch.arange(keys - queries, keys)[:, None]
        j = torch.arange(keys)[None, :]
        if self.context is None:
            near = (j < self.sink) | (i - j < self.window)
        else:
            near = (i < self.context) | (j < self.sink) | (j >= self.context - self.window)
        kv = self.streamed[layer]
        streamed = kv.repeat_interleave(heads // kv.numel())  # (heads,): each query head streams with its KV group
        return (j <= i) & (near | ~streamed[:, None, None])


def masked_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Attention under the module's StreamMask; query (B, H, T, D), key/value (B, KV, S, D) with S >= T -> (B, T, H, D)."""
    heads, groups = query.shape[1], query.shape[1] // key.shape[1]
    allowed = module.stream_mask.allowed(module.layer_idx, heads, query.shape[2], key.shape[2]).to(query.device)
    out = F.scaled_dot_product_attention(
        query, key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1), attn_mask=allowed[None], scale=scaling
    )
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def streaming(model, mask: StreamMask):
    """The model's attention under ``mask`` inside the block (its own implementation restored after)."""
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, masked_attention)
    own = model.config._attn_implementation
    attention = [layer.self_attn for layer in model.model.layers]
    for module in attention:
        module.stream_mask = mask
    model.set_attn_implementation(NAME)
    try:
        yield model
    finally:
        model.set_attn_implementation(own)
        for module in attention:
            del module.stream_mask


@torch.no_grad()
def greedy(model, ids: list[int], max_new_tokens: int, stop: set[int], cache=None) -> list[int]:
    """Greedy continuation of ``ids`` (prompt, then a token at a time on ``cache``, a fresh DynamicCache when None),
    stopping after a ``stop`` token."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config) if cache is None else cache
    new, step = [], torch.tensor([ids])
    for _ in range(max_new_tokens):
        token = int(model(input_ids=step, past_key_values=cache, use_cache=True, logits_to_keep=1).logits[0, -1].argmax())
        new.append(token)
        if token in stop:
            break
        step = torch.tensor([[token]])
    return new


def stop_tokens(model) -> set:
    """The model's end-of-sequence ids, whichever form its generation config gives them in."""
    stop = model.generation_config.eos_token_id
    return set(stop if isinstance(stop, list) else [stop])


def answers(model, tokenizer, prompts: list[dict], streamed: torch.Tensor, sink: int, window: int, kvpress: bool,
            max_new_tokens: int) -> list[str]:  # fmt: skip
    """Greedy answers to ``prompts`` ({"context_ids", "question_ids"}) with ``streamed`` KV groups under the mask."""
    stop = stop_tokens(model)
    out = []
    for prompt in prompts:
        context = len(prompt["context_ids"]) if kvpress else None
        with streaming(model, StreamMask(streamed.bool(), sink, window, context)):
            new = greedy(model, prompt["context_ids"] + prompt["question_ids"], max_new_tokens, stop)
        out.append(tokenizer.decode(new, skip_special_tokens=True))
    return out


def gated_answers(model, tokenizer, prompts: list[dict], streamed: torch.Tensor, sink: int, window: int, kvpress: bool,
                  max_new_tokens: int) -> list[str]:  # fmt: skip
    """headprune's own answers: the streaming gates at alpha 0 on ``streamed`` groups, decoding on the smaller StreamCache."""
    from headprune.core.stream_cache import StreamCache
    from headprune.core.stream_gates import StreamGates

    if kvpress:
        raise ValueError("the gated model streams in prefill too: kvpress's semantics come from the explicit mask (answers)")
    gates = StreamGates(model, sink, window, unit="kv_group")
    mask = {group: (~streamed.bool()).float() for group in gates.groups}  # (layers, KV heads), 1 = full, 0 = streamed
    stop = stop_tokens(model)
    out = []
    try:
        for prompt in prompts:
            new = greedy(model, prompt["context_ids"] + prompt["question_ids"], max_new_tokens, stop, StreamCache(gates, mask))
            out.append(tokenizer.decode(new, skip_special_tokens=True))
    finally:
        gates.remove()
    return out
