"""Streaming gates: the second action on a decoder's attention units, with the surface of HeadGates and their KV-group view."""

import torch

from headprune.core.attention.gates import HeadGates
from headprune.core.attention.kv_groups import KVGroupGates
from headprune.core.site_gates import SiteGateMethods
from headprune.core.stream_sites import StreamSite

STREAMED_GROUP = "dec_self"  # the causal self-attention of a decoder: the only attention whose KV cache grows
STREAM_UNITS = ("head", "kv_group")
MASKED_ATTENTION = ("sdpa", "eager")  # the attention implementations that take any 4-D attention mask


class StreamGates(SiteGateMethods):
    """Streaming gates on every decoder self-attention module: set a mask of alphas, read the groups, record gate gradients."""

    noun = "head"  # in mask messages
    action = "stream"  # what a gate value of 0 does to a unit (HeadGates: remove it)

    def __init__(self, model_or_heads, sink: int, window: int, unit: str | None = None):
        """``model_or_heads``: a decoder model or its HeadGates; ``unit``: ``kv_group`` (default with grouped KV heads) or ``head``."""
        if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
            raise ValueError(f"the streaming sink is a number of initial tokens, a whole number >= 0; got {sink!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise ValueError(
                f"the streaming window is a number of recent tokens counting the token itself, a whole number >= 1; got {window!r}"
            )
        heads = model_or_heads if isinstance(model_or_heads, HeadGates) else HeadGates(model_or_heads)
        self.heads, self.model, self.inner, self.sink, self.window = heads, heads.model, heads.inner, sink, window
        if STREAMED_GROUP not in heads.groups:
            raise ValueError(
                f"streaming limits a head to a sink and a recent window of its causal KV cache; {type(self.model).__name__} has "
                f"no causal self-attention (attention groups {sorted(heads.groups)}): an encoder attends to every token at once "
                "and caches nothing, so none of its heads can be streamed"
            )
        if heads.inner not in MASKED_ATTENTION:
            raise ValueError(
                f"streaming adds a sink + window mask to the attention, which the {heads.inner!r} implementation does not take "
                f"as a 4-D mask: load the model with attn_implementation one of {MASKED_ATTENTION}"
            )
        sites = [site for site in heads.sites if site.group == STREAMED_GROUP]
        output_gated = [site.path for site in sites if site.gate_at != "attention"]
        if output_gated:
            raise ValueError(
                f"streaming runs in the attention function, but the heads of {output_gated[:3]} are gated at the output projection"
            )
        grouped = heads.heads_per_kv[STREAMED_GROUP] > 1
        self.unit = unit or ("kv_group" if grouped else "head")
        if self.unit not in STREAM_UNITS:
            raise ValueError(f"the unit of a streaming gate must be one of {STREAM_UNITS}, got {self.unit!r}")
        if self.unit == "kv_group" and not grouped:
            raise ValueError(
                f"unit kv_group needs grouped-query attention (fewer KV heads than query heads); {type(self.model).__name__} has one "
                "KV head per query head: stream unit=head"
            )
        self.view = KVGroupGates(heads) if self.unit == "kv_group" else heads  # masks and scores in this unit, all groups
        # the streamed group's shapes, all of the original model: (layers, units per layer), (layers, KV heads), query heads per KV
        self.groups = {STREAMED_GROUP: self.view.groups[STREAMED_GROUP]}
        self.kv_groups = {STREAMED_GROUP: heads.kv_groups[STREAMED_GROUP]}
        self.heads_per_kv = {STREAMED_GROUP: heads.heads_per_kv[STREAMED_GROUP]}
        self.sites = []
        for site in sites:  # each attention site's streaming gate (the one already attached, set to this sink and window)
            if site.stream is None:
                site.stream = StreamSite(site, sink, window)
                site.stream.hook = site.core.register_forward_pre_hook(site.stream.record_past, with_kwargs=True)
            site.stream.sink, site.stream.window = sink, window
            self.sites.append(site.stream)

    def present(self) -> dict[str, torch.Tensor]:
        """{"dec_self": bool [layers, units]}: True where the unit (any query head of it) is still in the weights."""
        return {STREAMED_GROUP: self.view.present()[STREAMED_GROUP]}

    def head_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """The alphas per query head: a KV group's alpha on each of its query heads."""
        return self.view.head_mask(self.normalize_mask(mask, hard=hard))

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{"stream": the alphas per query head}: what the mask gates, by the kind of gates that act."""
        return {"stream": self.head_mask(mask, hard=hard)}

    def scores_from_heads(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Scores in this unit from per-query-head scores: the mean of each KV group's query heads (``kv_group``)."""
        return self.view.scores_from_heads(scores)

    def set_mask(self, mask) -> None:
        """Set every streaming gate to ``mask`` (alphas in this unit); ``None`` streams nothing (and costs nothing)."""
        alphas = None if mask is None else self.head_mask(mask)[STREAMED_GROUP]  # (..., L, H) over the original query heads
        for site in self.sites:
            ids = site.head_ids or [0]
            site.gate = None if alphas is None else alphas[..., site.layer, :].index_select(-1, torch.tensor(ids, device=alphas.device))

    def remove(self) -> None:
        """Detach the streaming gates from the model (the head gates stay)."""
        for site in self.sites:
            site.gate = None
            site.hook.remove()
            site.attention.stream = None

    def describe(self) -> str:
        """One line: the unit, sink and window, and the units per layer."""
        layers, units = self.groups[STREAMED_GROUP]
        return f"{STREAMED_GROUP:9s} stream unit={self.unit} sink={self.sink} window={self.window} layers={layers} units/layer={units}"
