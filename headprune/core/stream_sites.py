"""One attention module's streaming gate: its full attention mixed with its attention under the sink + window mask (a streamed
head sees only the first ``sink`` positions and a recent ``window`` of its causal past)."""

from dataclasses import dataclass, field

import torch

from headprune.core.site_gates import gate_and_probe


def streaming_keep(query_positions: torch.Tensor, key_positions: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """Bool (Tq, Tk): True where a streamed head at query position i may attend to key position j."""
    i = query_positions.reshape(-1, 1)
    j = key_positions.reshape(1, -1).to(i.device)
    return (j <= i) & ((j < sink) | (i - j < window))


def streaming_mask(attention_mask: torch.Tensor | None, keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The model's own attention mask restricted to ``keep`` (Tq, Tk), as an additive float mask (1 or B, 1, Tq, Tk)."""
    lowest = torch.finfo(dtype).min
    keep = keep.view(1, 1, *keep.shape)
    mask = keep.new_ones(()) if attention_mask is None else attention_mask[..., : keep.shape[-1]]  # none: every key allowed
    if mask.dtype == torch.bool:  # True where allowed: as an additive mask
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, lowest)
    return mask.to(dtype).masked_fill(~keep.to(mask.device), lowest)


@dataclass(eq=False)
class CacheHandover:
    """What a StreamCache layer gives the attention function of one forward: which query heads stream, and their short KV."""

    full_heads: torch.Tensor  # (Hf,) positions (in weight order) of the query heads whose KV group keeps every key
    streamed_heads: torch.Tensor  # (Hs,) positions of the query heads of streamed KV groups
    past: int  # tokens cached before this forward: the queries sit at positions past, past + 1, ...
    keys: torch.Tensor  # (B, KVs, S, D) the streamed groups' keys: their sink and recent window (and the new tokens)
    values: torch.Tensor  # (B, KVs, S, D)
    positions: torch.Tensor  # (S,) absolute position of each of those keys (any order: keys carry their RoPE)
    first: int  # the position of the first full-group key and of the model's first mask column (> 0: a sliding window)
    exact: bool  # every query attends to every one of those keys (a decode step): no streaming mask needed


@dataclass(eq=False)
class StreamSite:
    """The streaming gate of one attention module; structure (group, layer, head ids, KV heads) is its AttentionSite's."""

    attention: object  # the AttentionSite (headprune.core.attention.gates)
    sink: int
    window: int
    gate: torch.Tensor | None = None  # alpha (H,) or (B, H) over the present query heads; None = not streamed
    probes: list[torch.Tensor] = field(default_factory=list)  # per-token gate probes (B, T, H) while recording
    recording: bool = False
    past: int | None = None  # tokens cached before this forward (set by a forward pre-hook; None: keys start at 0)
    handover: CacheHandover | None = None  # set by a StreamCache layer's update, taken by the next attention call
    hook: object = None  # the pre-hook's handle

    def __getattr__(self, name):  # group, layer, head_ids, kv_ids, kv_positions, ...: the attention site's own
        if name == "attention":
            raise AttributeError(name)
        return getattr(self.attention, name)

    @property
    def active(self) -> bool:
        """Whether the streaming branch must run: a gate is set, or gate gradients are recorded."""
        return self.gate is not None or (self.recording and torch.is_grad_enabled())

    def record_past(self, module, args, kwargs) -> None:
        """Forward pre-hook of the attention module: how many tokens its cache layer held before this forward."""
        names = ("past_key_values", "layer_past")  # how the families' attention modules are handed the KV cache
        cache = next((kwargs[name] for name in names if kwargs.get(name) is not None), None)
        layer = getattr(module, "layer_idx", None)
        self.past = (
            int(cache.get_seq_length(layer)) if cache is not None and layer is not None and hasattr(cache, "get_seq_length") else None
        )

    def take_handover(self) -> CacheHandover | None:
        """The short KV a StreamCache layer handed over for this forward (cleared: it serves one call)."""
        handover, self.handover = self.handover, None
        return handover

    def mix(self, inner, module, query, key, value, attention_mask, kwargs: dict, full: torch.Tensor) -> torch.Tensor:
        """``alpha * full + (1 - alpha) * streamed`` per head (B, Tq, H, D), ``streamed`` run by ``inner`` under the streaming mask."""
        past = self.past if self.past is not None else key.shape[-2] - query.shape[-2]
        end = past + query.shape[-2]  # queries follow the ``past`` cached tokens; keys end with the last query
        queries, keys = torch.arange(past, end, device=query.device), torch.arange(end - key.shape[-2], end, device=query.device)
        mask = streaming_mask(attention_mask, streaming_keep(queries, keys, self.sink, self.window), query.dtype)
        streamed, _ = inner(module, query, key, value, mask, **kwargs)  # (B, Tq, H, D)
        alpha = gate_and_probe(self, full[..., 0]).unsqueeze(-1)  # active: a gate, a probe or both
        return alpha * full + (1 - alpha) * streamed

    def split(self, handover: CacheHandover, inner, module, query, key, value, attention_mask, kwargs: dict) -> torch.Tensor:
        """Per-head outputs (B, Tq, H, D): full groups' heads on ``key``/``value`` (full groups only), streamed heads on the handed-over KV."""
        batch, heads, length, _ = query.shape
        out = query.new_zeros(batch, length, heads, value.shape[-1])
        if handover.full_heads.numel():
            out[:, :, handover.full_heads], _ = inner(
                module, query.index_select(1, handover.full_heads), key, value, attention_mask, **kwargs
            )
        if not handover.streamed_heads.numel():
            return out
        positions, end = handover.positions, handover.past + length  # the streamed heads over their sink + window keys
        mask = None
        if attention_mask is not None or not handover.exact:  # under the model's mask at those positions
            keep = streaming_keep(torch.arange(handover.past, end, device=positions.device), positions, self.sink, self.window)
            keep &= (positions >= handover.first).view(1, -1)  # before a sliding window (first > 0): the model's mask hides it
            columns = (positions - handover.first).clamp(min=0)  # the model's mask columns start at ``first``
            mask = streaming_mask(None if attention_mask is None else attention_mask.index_select(-1, columns), keep, query.dtype)
        streamed = query.index_select(1, handover.streamed_heads)
        out[:, :, handover.streamed_heads], _ = inner(module, streamed, handover.keys, handover.values, mask, **kwargs)
        return out
