"""Streaming attention: a head that sees only the first ``sink`` positions and a recent ``window`` of its causal past."""

import torch


def check_span(sink: int, window: int) -> None:
    """Raise a ValueError unless ``sink`` >= 0 and ``window`` >= 1 are whole numbers."""
    if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
        raise ValueError(f"the streaming sink is a number of initial tokens, a whole number >= 0; got {sink!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(
            f"the streaming window is a number of recent tokens counting the token itself, a whole number >= 1; got {window!r}"
        )


def streaming_keep(query_positions: torch.Tensor, key_positions: torch.Tensor, sink: int, window: int) -> torch.Tensor:
    """Bool (Tq, Tk): True where a streamed head at query position i may attend to key position j (see the module doc)."""
    i = query_positions.reshape(-1, 1)
    j = key_positions.reshape(1, -1).to(i.device)
    return (j <= i) & ((j < sink) | (i - j < window))


def sequence_positions(past: int, query_length: int, key_length: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Absolute positions (Tq,), (Tk,) of queries that follow ``past`` cached tokens and of keys that end with the last query."""
    end = past + query_length
    queries = torch.arange(past, end, device=device)
    keys = torch.arange(end - key_length, end, device=device)
    return queries, keys


def streaming_mask(attention_mask: torch.Tensor | None, keep: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The model's own attention mask restricted to ``keep`` (Tq, Tk), as an additive float mask (1 or B, 1, Tq, Tk)."""
    lowest = torch.finfo(dtype).min
    keep = keep.view(1, 1, *keep.shape)
    if attention_mask is None:
        allowed = keep
    else:
        mask = attention_mask[..., : keep.shape[-1]]
        if mask.dtype != torch.bool:
            return mask.to(dtype).masked_fill(~keep.to(mask.device), lowest)
        allowed = mask & keep.to(mask.device)
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(~allowed, lowest)
