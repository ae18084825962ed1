"""A transformers KV cache that keeps less: streamed KV groups hold their sink and recent window, the others everything."""

import torch
from transformers.cache_utils import CacheLayerMixin, DynamicCache, DynamicLayer, get_layer_types_and_kwargs

from headprune.core.stream_sites import CacheHandover


class StreamedLayer(CacheLayerMixin):
    """One layer's cache with some KV groups streamed: the others in ``base`` (a stock layer), the streamed ones in a short buffer."""

    is_compileable = False
    is_croppable = False

    def __init__(self, site, streamed_kv: list[int], base: DynamicLayer):
        """``site``: the StreamSite of the layer's attention; ``streamed_kv``: positions (in the k/v weights) of its streamed KV heads."""
        super().__init__()
        self.site, self.base = site, base
        self.sink, self.window = site.sink, site.window
        self.capacity = site.sink + site.window
        streamed = torch.zeros(site.computed_kv_heads, dtype=torch.bool)  # (KV,)
        streamed[streamed_kv] = True
        head_streamed = streamed[site.kv_positions()]  # (H,): whether each computed query head's KV group streams
        self.full_kv, self.streamed_kv = (~streamed).nonzero().view(-1), streamed.nonzero().view(-1)
        self.full_heads, self.streamed_heads = (~head_streamed).nonzero().view(-1), head_streamed.nonzero().view(-1)
        self.cumulative = 0  # tokens seen
        self.short_keys = self.short_values = self.positions = None  # (B, KVs, S, D), (S,): S = min(tokens, sink + window)

    @property
    def is_sliding(self) -> bool:
        return self.base.is_sliding

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        for name in ("full_kv", "streamed_kv", "full_heads", "streamed_heads"):
            setattr(self, name, getattr(self, name).to(self.device))
        self.short_keys = key_states.index_select(1, self.streamed_kv)[..., :0, :]
        self.short_values = value_states.index_select(1, self.streamed_kv)[..., :0, :]
        self.positions = torch.zeros(0, dtype=torch.long, device=self.device)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Cache the new keys and values (B, KV, T, D); return the full groups' keys and values, hand the streamed ones' over."""
        if self.site.attention.stream is not self.site:
            raise ValueError("the StreamGates this cache was made with were removed from the model: make a new StreamCache")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        past, length = self.cumulative, key_states.shape[-2]
        first = self.get_mask_sizes(length)[1]  # where the full groups' keys (and the model's mask) start
        self.cumulative += length
        sliding = self.base.is_sliding  # the layer's own window is short already: every group stays in it, streamed ones masked
        if sliding:
            keys, values = self.base.update(key_states, value_states, *args, **kwargs)
            positions = torch.arange(first, first + keys.shape[-2], device=self.device)
            short_keys, short_values = keys.index_select(1, self.streamed_kv), values.index_select(1, self.streamed_kv)
            keys, values = keys.index_select(1, self.full_kv), values.index_select(1, self.full_kv)
        else:
            keys, values = self.base.update(
                key_states.index_select(1, self.full_kv), value_states.index_select(1, self.full_kv), *args, **kwargs
            )
            new_keys, new_values = key_states.index_select(1, self.streamed_kv), value_states.index_select(1, self.streamed_kv)
            if length == 1 and self.short_keys.shape[-2] == self.capacity:
                slot = self.sink + (past - self.sink) % self.window  # a decode step: overwrite the key that leaves the window
                self.short_keys[:, :, slot], self.short_values[:, :, slot] = new_keys[:, :, 0], new_values[:, :, 0]
                self.positions[slot] = past
                short_keys, short_values, positions = self.short_keys, self.short_values, self.positions
            else:  # prefill, or a buffer still filling: every old and new key, then keep what the last query sees
                short_keys, short_values = torch.cat([self.short_keys, new_keys], -2), torch.cat([self.short_values, new_values], -2)
                positions = torch.cat([self.positions, torch.arange(past, past + length, device=self.device)])
                self._keep(short_keys, short_values, positions, last=past + length - 1)
        self.keys, self.values = self.base.keys, self.base.values
        exact = length == 1 and not sliding
        self.site.handover = CacheHandover(self.full_heads, self.streamed_heads, past, short_keys, short_values, positions, first, exact)
        return keys, values

    def _keep(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, last: int) -> None:
        """Store the keys the query at position ``last`` attends to (the sink and the window) in their buffer slots."""
        kept = ((positions < self.sink) | (last - positions < self.window)).nonzero().view(-1)
        kept_positions = positions[kept]  # the sink in place, the window rolling over ``window`` slots after it
        slots = torch.where(kept_positions < self.sink, kept_positions, self.sink + (kept_positions - self.sink) % self.window)
        kept = kept[slots.argsort()]  # the slots are 0, 1, ... in some order: the kept keys in slot order
        self.short_keys, self.short_values, self.positions = keys[:, :, kept], values[:, :, kept], positions[kept]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        """The mask the full groups need: the base layer's (every position so far, or its sliding window)."""
        return self.base.get_mask_sizes(query_length) if self.base.is_sliding else (self.cumulative + query_length, 0)

    def get_seq_length(self) -> int:
        return self.cumulative

    def get_max_length(self) -> int:
        return self.base.get_max_length()

    def reset(self) -> None:
        self.base.reset()
        self.keys = self.values = self.short_keys = self.short_values = self.positions = None
        self.cumulative, self.is_initialized = 0, False

    def crop(self, tokens_to_remove: int) -> None:
        raise ValueError("a streamed KV group has dropped the keys that left its window: this cache cannot be cropped")

    def _batch(self, name: str, arg, pick) -> None:
        """The base layer's batch operation ``name`` on ``arg``, and ``pick`` (a function of a tensor) on the streamed groups' rows."""
        getattr(self.base, name)(arg)
        if self.is_initialized:
            self.short_keys, self.short_values = pick(self.short_keys), pick(self.short_values)
        self.keys, self.values = self.base.keys, self.base.values

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._batch("reorder_cache", beam_idx, lambda t: t.index_select(0, beam_idx.to(t.device)))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._batch("batch_repeat_interleave", repeats, lambda t: t.repeat_interleave(repeats, dim=0))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._batch("batch_select_indices", indices, lambda t: t[indices, ...])


def _streamed_layers(gates, mask):
    """(site, cache layer index, positions in the k/v weights of its KV heads whose query heads all have alpha 0) per site."""
    alphas = gates.head_mask(mask, hard=True)["dec_self"]
    if alphas.dim() != 2:
        raise ValueError(
            f"a cache streams one set of KV groups for the whole batch: give one mask [layers, units], got {tuple(alphas.shape)}"
        )
    for site in gates.sites:
        streamed = []  # positions (in the k/v weights) of its KV heads whose query heads all have alpha 0 (none: no heads left)
        for position, kv in enumerate(site.kv_ids):
            values = {float(alphas[site.layer, h]) for h in site.head_ids if site.kv_of(h) == kv}
            if values == {0.0}:
                streamed.append(position)
            elif len(values) > 1:
                raise ValueError(
                    f"layer {site.layer}: the query heads of KV head {kv} are streamed only in part; a cache keeps or drops a KV "
                    "head's keys for all of its query heads: stream whole KV groups (StreamGates unit kv_group)"
                )
        yield site, getattr(site.core, "layer_idx", site.layer), streamed


class StreamCache(DynamicCache):
    """A DynamicCache whose streamed KV groups hold only their sink and recent window (see the module doc)."""

    def __init__(self, gates, mask):
        """``gates``: the model's StreamGates (their sink and window); ``mask``: one hard mask in their unit (0 = streamed)."""
        layers = list(_streamed_layers(gates, mask))
        super().__init__(config=gates.model.config)
        self.gates, self.sink, self.window = gates, gates.sink, gates.window
        self.streamed = {}  # {cache layer: [positions of its streamed KV heads]}
        for site, index, streamed in layers:
            if not streamed:
                continue
            if site.kv_index is not None or site.family.head_indexed_kwargs:
                raise ValueError(
                    f"layer {site.layer}: its KV groups became uneven by pruning (or its attention takes per-head arguments); the "
                    "streaming cache hands whole KV groups to the attention: stream it under the gates with the full cache instead"
                )
            base = self.layers[index]
            if not isinstance(base, DynamicLayer) or not hasattr(base, "get_mask_sizes"):
                raise ValueError(f"layer {index}: a {type(base).__name__} cache layer cannot hold streamed KV groups")
            self.layers[index] = StreamedLayer(site, streamed, base)
            self.streamed[index] = streamed


def held_kv_bytes(cache) -> int:
    """Bytes of the keys and values a cache holds now (every layer, every tensor of keys or values)."""
    tensors = (getattr(layer, name, None) for layer in cache.layers for name in ("keys", "values", "short_keys", "short_values"))
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def stream_cache_bytes(gates, mask, tokens: int, batch: int = 1) -> int:
    """Bytes ``StreamCache(gates, mask)`` holds after ``tokens`` tokens of ``batch`` sequences (streamed groups: sink + window)."""
    layer_types, layer_kwargs = get_layer_types_and_kwargs(gates.model.config.get_text_config(decoder=True))
    total = 0
    for site, index, streamed_kv in _streamed_layers(gates, mask):
        streamed = len(streamed_kv)
        sliding = layer_kwargs[index].get("sliding_window") if layer_types[index] != "full_attention" else None
        if sliding is not None:
            keys = site.computed_kv_heads * min(tokens, sliding - 1)  # every group in the layer's own window
        else:
            keys = (site.computed_kv_heads - streamed) * tokens + streamed * min(tokens, gates.sink + gates.window)
        total += 2 * keys * site.head_dim * site.linear("key").weight.element_size() * batch
    return total
