"""Head gates: find a model's attention modules and multiply each head's output by a gate."""

import sys
from dataclasses import dataclass

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.bert.modeling_bert import eager_attention_forward as bert_eager

from headprune.core.attention.tensors import attach_output_gate, gate_heads, score_bias, slice_head_kwargs
from headprune.core.families import GATE_MECHANISMS, GROUPS, Family, family_for, match_site
from headprune.core.site_gates import Site, SiteGates, alias, kept_on, ordered_sites, unit_groups

PREFIX = "headprune_"


SITE_ATTR = "_headprune_site"  # the site (and its head bookkeeping), on its attention module (a deep copy gets its own)


@dataclass(eq=False)
class AttentionSite(Site):
    """One attention module: its projections, and its query heads as its units (``head_ids``) with their KV heads."""

    block: nn.Module
    core: nn.Module
    family: Family
    head_dim: int
    num_kv_heads_orig: int  # KV heads in the original module (= num_heads_orig without grouped KV heads)
    kv_ids: list[int]  # original ids of the KV heads still present, in weight order
    kv_index: torch.Tensor | None = None  # (H,) KV position of each computed query head when groups became uneven
    entropy_hook: object = None  # callable(site, query, key, mask, scaling, bias=None) while entropy is recorded
    gate_at: str = "attention"  # where the gate acts: "attention" (the attention-function wrapper) or "output" (attach_output_gate)
    stream: object = None  # the streaming gate (headprune.core.stream_sites.StreamSite) while StreamGates are attached
    copies: tuple[int, int] | None = None  # (B, M): its rows are M identical copies of B rows (a batched pass): attend on B

    head_ids = alias("unit_ids")  # original ids of the heads still present, in weight order
    num_heads_orig = alias("units_orig")
    num_heads = alias("num_units")
    computed_heads = alias("computed_units")  # the present heads, or the one zero phantom of an emptied layer
    unit_width = alias("head_dim")  # input columns of the output projection per head

    def linear(self, which: str) -> nn.Module:
        """The q/k/v/output projection named by the family table (nn.Linear or Conv1D; one module for fused q/k/v)."""
        return self.block.get_submodule(getattr(self.family, which))

    def projections(self) -> list[nn.Module]:
        """The distinct q/k/v/output projection modules (a fused q/k/v projection once)."""
        return list({id(m): m for m in map(self.linear, ("query", "key", "value", "output"))}.values())

    @property
    def computed_kv_heads(self) -> int:
        """KV heads the module computes (the phantom counts as one)."""
        return max(len(self.kv_ids), 1)

    @property
    def heads_per_kv(self) -> int:
        """Query heads per KV head in the original module (1 without grouped KV heads)."""
        return self.num_heads_orig // self.num_kv_heads_orig

    def kv_of(self, head: int) -> int:
        """The original id of the KV head that query head ``head`` (original id) attends with."""
        return int(head) // self.heads_per_kv  # repeat_kv: query head h reads KV head h // groups

    @property
    def needs_wrapper(self) -> bool:
        """Whether the pruned weights only run through the attention wrapper (uneven KV groups, head-indexed kwargs to cut)."""
        return self.kv_index is not None or (bool(self.family.head_indexed_kwargs) and self.num_heads != self.num_heads_orig)

    def kv_positions(self) -> list[int]:
        """Position in the k/v weights of the KV head of every computed query head (the phantom reads the phantom)."""
        return [0] if not self.head_ids else [self.kv_ids.index(self.kv_of(h)) for h in self.head_ids]


def _on_shared_rows(inner, batch: int, copies: int):
    """``inner`` run on the first ``batch`` rows of q/k/v made of ``copies`` identical copies, its output repeated to every row."""

    def shared(module, query, key, value, attention_mask, **kwargs):
        mask = attention_mask[:batch] if attention_mask is not None and attention_mask.shape[0] > 1 else attention_mask
        out, weights = inner(module, query[:batch], key[:batch], value[:batch], mask, **kwargs)
        return out.repeat(copies, 1, 1, 1), weights  # (B, T, H, D) -> (M*B, T, H, D)

    return shared


def _make_gated(inner_name: str):
    """An attention function that runs ``inner_name`` and then applies the module's head gate."""

    def gated_attention(module, query, key, value, attention_mask, **kwargs):
        if inner_name == "eager":  # the eager function defined next to the module's class (its own math)
            inner = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None) or bert_eager
        else:
            inner = ALL_ATTENTION_FUNCTIONS[inner_name]
        site = getattr(module, SITE_ATTR, None)
        if site is None:
            return inner(module, query, key, value, attention_mask, **kwargs)
        if site.copies is not None:
            inner = _on_shared_rows(inner, *site.copies)
        if site.kv_index is not None:  # uneven query heads per KV head after pruning: each gets its own copy of its KV head
            index = site.kv_index.to(key.device)
            key, value = key.index_select(1, index), value.index_select(1, index)  # (B, H, T, D), groups = 1
        kwargs, stream = slice_head_kwargs(site, kwargs), site.stream
        handover = stream.take_handover() if stream is not None else None
        if handover is not None:  # a StreamCache layer: its full KV groups in key/value, its streamed groups' short KV handed over
            out = stream.split(handover, inner, module, query, key, value, attention_mask, kwargs)
            return (gate_heads(site, out) if site.gate_at == "attention" else out), None
        out, weights = inner(module, query, key, value, attention_mask, **kwargs)  # out: (B, T, H, D)
        if stream is not None and stream.active:  # per head: alpha * full + (1 - alpha) * streamed (sink + window)
            out = stream.mix(inner, module, query, key, value, attention_mask, kwargs, out)
        if site.entropy_hook is not None:
            if key.shape[1] != query.shape[1]:
                key = key.index_select(1, torch.tensor(site.kv_positions(), device=key.device))  # (B, H, T, D)
            site.entropy_hook(site, query, key, attention_mask, kwargs.get("scaling"), bias=score_bias(site, kwargs))
        if site.gate_at == "attention":
            out = gate_heads(site, out)
        return out, weights

    return gated_attention


def register_wrapper(prefix: str, inner_name: str, make) -> str:
    """Register ``make(inner_name)`` as attention function ``prefix + inner_name``, with the inner one's mask format."""
    name = prefix + inner_name
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, make(inner_name))
        AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS.get(inner_name) or ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name


def ensure_gated(inner_name: str) -> str:
    """Register the gated wrapper (and the matching mask function) for one implementation."""
    return register_wrapper(PREFIX, inner_name, _make_gated)


def own_attention_name(model: nn.Module) -> str:
    """The model's own attention implementation (the one headprune's wrapper wraps, if it is routed through it)."""
    original = model.config._attn_implementation or "sdpa"
    return original[len(PREFIX) :] if original.startswith(PREFIX) else original


def route_attention(model: nn.Module) -> str:
    """Point the model at headprune's wrapper of its attention (public setter); returns the wrapped implementation."""
    inner = own_attention_name(model)
    gated_name = ensure_gated(inner)
    model.set_attn_implementation(gated_name)
    if model.config._attn_implementation != gated_name:
        raise ValueError(
            f"{type(model).__name__} cannot switch its attention implementation (transformers' "
            "AttentionInterface), so its heads cannot be gated"
        )
    return inner


def find_sites(model: nn.Module) -> list[AttentionSite]:
    """All attention modules of a model, ordered by group then layer."""
    family = family_for(model)
    sites = [
        kept_on(block.get_submodule(family.core), SITE_ATTR, lambda: _new_site(model, family, path, block, *matched))
        for path, block in model.named_modules()
        if (matched := match_site(family.sites, path)) is not None
    ]
    return ordered_sites(sites, GROUPS, f"found no attention modules in {type(model).__name__} for family {family.name}")


def _new_site(model: nn.Module, family: Family, path: str, block: nn.Module, group: str, layer: int) -> AttentionSite:
    """An attention module's site with every head present."""
    core = block.get_submodule(family.core)  # "": the block itself
    head_dim = int(getattr(core, family.head_dim_attr))
    if family.head_count_attr:
        n_heads = int(getattr(core, family.head_count_attr))
    elif family.heads_in_config:
        n_heads = int(getattr(model.config, family.config_head_counts[0]))
    else:
        n_heads = block.get_submodule(family.query).out_features // head_dim
    if family.kv_groups_attr:
        n_kv = n_heads // int(getattr(core, family.kv_groups_attr))
    else:
        n_kv = int(getattr(core, family.kv_count_attrs[0])) if family.kv_count_attrs else n_heads
    heads, kv = list(range(n_heads)), list(range(n_kv))
    return AttentionSite(path, group, layer, n_heads, heads, block, core, family, head_dim, n_kv, kv, gate_at=family.gate)


class HeadGates(SiteGates):
    """Gates on every attention head of a model: set a mask, read the groups, record gate gradients."""

    unit = "head"  # masks and scores are per query head (headprune.core.attention.kv_groups.KVGroupGates: per KV group)
    noun = "head"
    find, attach = staticmethod(find_sites), staticmethod(attach_output_gate)

    def __init__(self, model: nn.Module, gate_at: str | None = None):
        """``gate_at``: "attention" or "output" for every site (default: each family's own mechanism)."""
        if gate_at is not None and gate_at not in GATE_MECHANISMS:
            raise ValueError(f"gate_at must be one of {GATE_MECHANISMS}, got {gate_at!r}")
        super().__init__(model)  # finds the sites and hooks the output projections of those that gate there
        for site in self.sites if gate_at is not None else ():
            site.gate_at = gate_at
            attach_output_gate(site)
        if any(site.gate_at == "attention" or site.needs_wrapper for site in self.sites):
            self.inner = route_attention(model)
        else:
            self.inner = own_attention_name(model)
            if model.config._attn_implementation != self.inner:
                model.set_attn_implementation(self.inner)  # gated at the output projection: the model's own attention

    @property
    def kv_groups(self) -> dict[str, tuple[int, int]]:
        """{group: (layers, KV heads per layer in the original model)}: a KV group is a KV head with all its query heads."""
        return unit_groups(self.sites, lambda site: site.num_kv_heads_orig)

    @property
    def heads_per_kv(self) -> dict[str, int]:
        """{group: query heads per KV head in the original model} (1 without grouped KV heads)."""
        return {g: heads // self.kv_groups[g][1] for g, (_, heads) in self.groups.items()}

    def head_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """The query-head mask of a mask in this unit: the checked mask itself."""
        return self.normalize_mask(mask, hard=hard)

    def scores_from_heads(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Scores in this unit from per-query-head scores: themselves."""
        return scores

    def remove(self) -> None:
        """Detach the gates and restore the model's own attention implementation."""
        super().remove()
        if any(site.needs_wrapper for site in self.sites):
            return  # uneven KV groups or sliced head-indexed kwargs after pruning: keep the wrapper
        self.model.set_attn_implementation(self.inner)

    def describe(self) -> str:
        """A one-line-per-group summary of the attention modules, with their KV heads where query heads share them."""
        lines = super().describe().split("\n")
        for line, (group, (_, heads)) in enumerate(self.groups.items()):
            kv_heads = self.kv_groups[group][1]
            if kv_heads != heads:
                lines[line] += f" kv_heads/layer={kv_heads} kv_present={[len(s.kv_ids) for s in self.sites if s.group == group]}"
        return "\n".join(lines)
