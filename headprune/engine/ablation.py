"""Many masks in one batched forward pass, reusing the activations of the unchanged lower layers."""

from contextlib import ExitStack, contextmanager

import torch
from torch import nn
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from headprune.core.attention.gates import PREFIX, ensure_gated, register_wrapper
from headprune.core.inputs import hooks_removed
from headprune.core.joint import shared_gates
from headprune.core.layer.sites import layer_stacks
from headprune.core.stream_gates import StreamGates
from headprune.core.unit_kinds import ablation_refusal
from headprune.core.units import FFN, QUERY_HEADS, base_mask, primitive_gates, unit_gates

REPLAYED = {QUERY_HEADS, FFN}  # the kinds whose gates the batcher sets per mask row (query heads, neurons)
FIRST_TOKEN_ATTR = "_headprune_first_token"  # on the last layer's attention module during a first-token-only pass


def _make_shared(inner: str):
    def shared_attention(module, query, key, value, attention_mask, **kwargs):
        if getattr(module, FIRST_TOKEN_ATTR, False):  # the last layer's attention, its queries on the first token only
            if key.shape[1] != query.shape[1]:
                # keys/values of T tokens went through the model's view(N, 1, -1, D): (N, T*H, 1, D) -> (N, H, T, D)
                n, heads, d = key.shape[0], query.shape[1], key.shape[-1]
                key = key.reshape(n, -1, heads, d).transpose(1, 2)
                value = value.reshape(n, -1, heads, d).transpose(1, 2)
            q_len, k_len = query.shape[-2], key.shape[-2]
            if attention_mask is not None and q_len < k_len and attention_mask.shape[-2] == k_len:
                attention_mask = attention_mask[..., :q_len, :]  # the query rows kept
        return ALL_ATTENTION_FUNCTIONS[PREFIX + inner](module, query, key, value, attention_mask, **kwargs)

    return shared_attention


@contextmanager
def _patched(module: nn.Module, fn):
    """Temporarily replace ``module.forward`` by ``fn`` (an instance-level forward already there is restored)."""
    previous = module.__dict__.get("forward")
    module.forward = fn
    try:
        yield
    finally:
        del module.forward
        if previous is not None:
            module.forward = previous


@contextmanager
def attention_implementation(model: nn.Module, name: str):
    """Run a block with the model's attention implementation set to ``name`` (a registered one), then restore it."""
    if not model._can_set_attn_implementation():  # attention that ignores transformers' interface (DeBERTa-v2): its own code runs
        yield
        return
    previous = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


@contextmanager
def recorded_outputs(layers):
    """Within the block, record the output of every module in ``layers``: yields the list they fill."""
    cache = [None] * len(layers)
    with hooks_removed(
        [layer.register_forward_hook(lambda mod, args, out, i=i: cache.__setitem__(i, out)) for i, layer in enumerate(layers)]
    ):
        yield cache


def _map_tensors(value, fn):
    """``fn`` applied to every tensor of a layer output or input (a tensor or nested tuples); other values as they are."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    return tuple(_map_tensors(v, fn) for v in value) if isinstance(value, tuple) else value


def _repeat(value, copies: int, batch: int | None = None):
    """Repeat every tensor in ``value`` (with ``batch``: only those of that many rows) ``copies`` times along the batch."""
    return _map_tensors(value, lambda t: t.repeat(copies, *[1] * (t.dim() - 1)) if t.dim() and batch in (None, t.shape[0]) else t)


def _take_masks(masks: dict[str, torch.Tensor], index) -> dict[str, torch.Tensor]:
    """The masks ``index`` (a list or a slice) of stacked masks {group: (M, L, U)}."""
    return {g: v[index] for g, v in masks.items()}


def _count(masks: dict[str, torch.Tensor]) -> int:
    return next(iter(masks.values())).shape[0]


def _by_first(masks: dict[str, torch.Tensor], layers: int) -> dict[int, list[int]]:
    """The indices of stacked masks {group: (M, L, U)} by their first changed layer (``layers``: none), lowest first."""
    changed = torch.stack([(value[:, :layers] != 1).any(-1) for value in masks.values()]).any(0)  # (M, L): mask m changes layer l
    firsts = torch.where(changed.any(1), changed.int().argmax(1), layers).tolist()  # argmax: the first True
    return {first: [i for i, f in enumerate(firsts) if f == first] for first in sorted(set(firsts))}


def _projection(linear: nn.Module, b: int, m: int, share: bool, source=None):
    """A forward for a q/k/v projection (nn.Linear or Conv1D): on B rows repeated M times when shared; from ``source`` when given."""
    own = type(linear).forward

    def forward(x):
        x = source["full"] if source is not None else x
        if share:  # the rows are M copies of B: project B rows once (a copy is far cheaper than the matmul)
            return own(linear, x[:b]).repeat(m, 1, 1)
        return own(linear, x)

    return forward


class MaskBatcher:
    """Evaluate many masks of an encoder classifier in batched forward passes (see the module doc)."""

    group = "enc_self"  # the one attention group of the models this engine handles
    ffn_group = "enc_ffn"  # and their feed-forward group
    handles = "encoder-only classifiers"

    @staticmethod
    def takes(gates) -> bool:
        """Whether the batcher evaluates masks of these gates (query heads, FFN neurons, streaming), not residual channels and the like."""
        return isinstance(gates, StreamGates) or set(shared_gates(gates)) <= REPLAYED

    def __init__(self, model: nn.Module, gates, max_rows: int = 128, first_token: bool = True):
        """``gates``: the gates of the masks' unit (query-head, KV-group, FFN, block or joint gates of ``model``)."""
        heads, ffn = primitive_gates(gates)
        if not self.takes(gates):
            raise ValueError(
                f"{type(self).__name__} evaluates masks of query heads and FFN neurons only, not of {sorted(shared_gates(gates))}"
            )
        heads = heads if heads is not None else unit_gates(model, QUERY_HEADS)  # the engine shares attention through the head sites
        self.stream = gates if isinstance(gates, StreamGates) else None  # masks of alphas: they stream units, none goes
        ffn_groups = set(ffn.groups) if ffn is not None else set()
        if set(heads.groups) != {self.group} or not ffn_groups <= {self.ffn_group}:
            raise ValueError(
                f"{type(self).__name__} handles {self.handles} (attention group {self.group} only); "
                f"this model has groups {[*heads.groups, *ffn_groups]}"
            )
        self.model, self.gates, self.max_rows = model, gates, int(max_rows)
        self.heads, self.ffn = heads, ffn
        self.sites = [s for s in heads.sites if s.group == self.group]  # ordered by layer
        layers = layer_stacks(model)  # {layer path: ...}: each site's layer is the one whose path its own extends
        self.layers = [model.get_submodule(next(p for p in layers if s.path.startswith(p + "."))) for s in self.sites]
        ensure_gated(heads.inner)  # the shared function calls the gated one (not registered yet when heads gate at the output)
        self.shared_name = register_wrapper("headprune_shared_", heads.inner, _make_shared)
        self.first_token_ok = first_token  # allow the first-token-only last layer (verified numerically before use)
        self.first_token: bool | None = None

    @contextmanager
    def _gated(self, masks: dict[str, torch.Tensor] | None):
        """Run with the query-head and neuron gates set to base masks {group: ...} (None: every gate removed)."""
        own = None if masks is None else {self.group: masks[self.group]}
        with ExitStack() as stack:
            stack.enter_context(self.heads.masked(None if self.stream is not None else own))
            if self.stream is not None:  # the masks are the streaming gates' own alphas; no head is gated
                stack.enter_context(self.stream.masked(own))
            elif self.ffn is not None:
                stack.enter_context(self.ffn.masked(None if masks is None else {g: masks[g] for g in self.ffn.groups if g in masks}))
            yield

    def _run(self, batch: dict, cache, first: int, masks: dict[str, torch.Tensor], first_token: bool) -> torch.Tensor:
        """Logits (M, B, C) for base masks {group: (M, L, U)} whose first changed layer is ``first``."""
        b = next(v for v in batch.values() if isinstance(v, torch.Tensor)).shape[0]
        m = _count(masks)
        replay = _repeat(cache[first - 1], m, b) if first > 0 else None
        with self._pass(replay, first, masks, b, first_token):
            logits = self.model(**{k: _repeat(v, m) for k, v in batch.items()}).logits
        return logits.view(m, b, -1)

    @contextmanager
    def _pass(self, replay, first: int, masks: dict[str, torch.Tensor], b: int, first_token: bool = False):
        """Set up one pass on M*B rows: per-row gates, layers < ``first`` replayed, layer ``first``'s attention shared."""
        m, last = _count(masks), len(self.layers) - 1
        rows = {g: v.repeat_interleave(b, dim=0) for g, v in masks.items()}  # (M*B, L, U): row m*B + b is mask m
        stash: dict = {}
        with ExitStack() as stack:
            stack.enter_context(self._gated(rows))
            self.sites[first].copies = (b, m)  # layer ``first`` attends on B rows of its M identical copies
            stack.callback(setattr, self.sites[first], "copies", None)
            if first_token:  # read by the shared-attention function
                setattr(self.sites[last].core, FIRST_TOKEN_ATTR, True)
                stack.callback(delattr, self.sites[last].core, FIRST_TOKEN_ATTR)
            stack.enter_context(attention_implementation(self.model, self.shared_name))
            for layer in self.layers[:first]:
                stack.enter_context(_patched(layer, lambda *a, **k: replay))
            for i in sorted({first, last} if first_token else {first}):
                linear = self.sites[i].linear
                for which in ("query", "key", "value"):
                    source = stash if first_token and i == last and which != "query" else None
                    stack.enter_context(_patched(linear(which), _projection(linear(which), b, m, i == first, source)))
            if first_token:
                layer = self.layers[last]
                own = type(layer).forward.__get__(layer)

                def first_token_forward(hidden, *args, **kwargs):
                    stash["full"] = hidden  # keys and values still see every token
                    return own(hidden[:, :1], *args, **kwargs)  # queries, output and FFN: the first token only

                stack.enter_context(_patched(layer, first_token_forward))
            yield

    def _check_first_token(self, batch: dict, cache, first: int, masks: torch.Tensor) -> bool:
        """Whether the model reads only the first token of the last layer (checked numerically, once, on masks changing ``first``)."""
        if self.first_token is None:
            probe = _take_masks(masks, slice(0, 1))

            def four(t):  # four examples are enough for the check
                return t[:4] if t.dim() else t

            batch, cache = {k: _map_tensors(v, four) for k, v in batch.items()}, _map_tensors(tuple(cache), four)
            full = self._run(batch, cache, first, probe, False)
            try:
                with_cut = self._run(batch, cache, first, probe, True)
                self.first_token = bool(torch.allclose(with_cut, full, atol=1e-5, rtol=1e-4))
            except (RuntimeError, ValueError, IndexError):  # a family whose layer code does not allow it
                self.first_token = False
        return self.first_token

    @torch.inference_mode()
    def logits(self, batch: dict, masks) -> torch.Tensor:
        """Logits (M, B, C) of the model under each mask (a list of masks in the gates' unit, or a tensor (M, L, H))."""
        stacked = self._stack(masks)
        with recorded_outputs(self.layers) as cache, self._gated(None):  # the unmasked logits and every layer's output
            base = self.model(**batch).logits
        out = base.new_empty((_count(stacked), base.shape[0], base.shape[-1]))
        chunk = max(1, self.max_rows // max(base.shape[0], 1))
        for first, idx in _by_first(stacked, len(self.layers)).items():
            if first == len(self.layers):
                out[idx] = base
                continue
            first_token = self.first_token_ok and self._check_first_token(batch, cache, first, _take_masks(stacked, idx))
            for start in range(0, len(idx), chunk):
                part = idx[start : start + chunk]
                out[part] = self._run(batch, cache, first, _take_masks(stacked, part), first_token)
        return out

    def _stack(self, masks) -> dict[str, torch.Tensor]:
        """The masks as base masks stacked per group {group: (M, L, U)}: query heads, and neurons when the gates have them."""
        if isinstance(masks, torch.Tensor) and masks.dim() == 3:
            masks = list(masks)
        if len(masks) == 0:
            raise ValueError("no masks to evaluate")
        if self.stream is not None:
            ones = {self.group: None}
            full = [self.stream.normalize_mask(self.stream.ones() if mk is None else mk) for mk in masks]
        else:
            ones = {**self.heads.ones(), **(self.ffn.ones() if self.ffn is not None else {})}
            full = [{**ones, **base_mask(self.gates, self.gates.ones() if mk is None else mk)} for mk in masks]  # None = no mask
        if any(f[g].dim() != 2 for f in full for g in ones):
            raise ValueError("the engine evaluates one mask [layers, units] per group for the whole batch, not one per example")
        return {g: torch.stack([f[g].float() for f in full]) for g in ones}


def single_unit_masks(shape: dict[str, tuple[int, int]], groups=None, unit: str = "head") -> tuple[list, list[tuple[str, int, int]]]:
    """One mask per unit removing only that unit, and each one's (group, layer, unit); a ValueError for a kind that refuses it."""
    refusal = ablation_refusal(unit)
    if refusal:
        raise ValueError(refusal)
    heads = [
        (g, layer, head)
        for g, (layers, units) in shape.items()
        if not groups or g in groups
        for layer in range(layers)
        for head in range(units)
    ]
    masks = [{g: torch.ones(size) for g, size in shape.items()} for _ in heads]  # each keeps every unit but its own
    for mask, (group, layer, head) in zip(masks, heads):
        mask[group][layer, head] = 0.0
    return masks, heads


def keep_one_masks(shape: dict[str, tuple[int, int]], group: str, layer: int) -> list:
    """For one layer: one mask per head that keeps only that head of the layer (all other layers intact)."""
    masks = [{g: torch.ones(size) for g, size in shape.items()} for _ in range(shape[group][1])]  # (layers, units) each
    for head, mask in enumerate(masks):
        mask[group][layer] = 0.0
        mask[group][layer, head] = 1.0
    return masks
