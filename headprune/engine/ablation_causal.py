"""Many masks of a decoder-only causal LM in batched passes: the NLL of every text under each mask (and the labels its argmax misses)."""

from contextlib import ExitStack

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from headprune.core.inputs import DECODER_INPUTS
from headprune.core.units import primitive_gates
from headprune.engine import ablation as engine
from headprune.engine.ablation import MaskBatcher, recorded_outputs


def label_stats(hidden: torch.Tensor, labels: torch.Tensor, head, head_tokens: int = 128) -> torch.Tensor:
    """(NLL sum, labels the argmax misses) per row (R, 2) in float64 from final hidden states (R, T, D) and labels (R, T)."""
    keep = labels != -100  # (R, T)
    row = keep.nonzero()[:, 0]  # the row of each labelled position, in the order of hidden[keep]
    picked, targets = hidden[keep], labels[keep]  # (N, D), (N,)
    sums = torch.zeros(hidden.shape[0], 2, dtype=torch.float64, device=hidden.device)
    for start in range(0, picked.shape[0], head_tokens):
        logits = head(picked[start : start + head_tokens]).float()  # (n, V)
        wanted = targets[start : start + head_tokens]
        nll = F.cross_entropy(logits, wanted, reduction="none")
        missed = logits.argmax(-1) != wanted
        sums.index_add_(0, row[start : start + head_tokens], torch.stack([nll.double(), missed.double()], 1))
    return sums


def row_label_stats(hidden: torch.Tensor, labels: torch.Tensor, head) -> torch.Tensor:
    """label_stats with the head run on (R, A, D), each row's A labelled positions in order, so per-row gates meet their rows."""
    keep = labels != -100  # (R, T)
    width = int(keep.sum(1).max()) if keep.numel() else 0
    order = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :width]  # (R, A): labelled positions first
    picked = hidden.gather(1, order.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))  # (R, A, D)
    wanted = labels.gather(1, order)  # (R, A); -100 past a row's labels
    logits = head(picked).float()  # (R, A, V)
    nll = F.cross_entropy(logits.transpose(1, 2), wanted, reduction="none")  # (R, A); 0 where -100
    missed = (logits.argmax(-1) != wanted) & (wanted != -100)
    return torch.stack([nll.double().sum(1), missed.double().sum(1)], 1)


def output_logits(model: nn.Module):
    """The LM head followed by what the model's forward does to its logits: Granite's scaling, Gemma's soft-capping."""
    head = model.get_output_embeddings()
    config = model.config if isinstance(model, PreTrainedModel) else None  # None: no scaling, no capping
    scaling = getattr(config, "logits_scaling", None)
    cap = getattr(config, "final_logit_softcapping", None)
    if not scaling and not cap:
        return head

    def logits(hidden: torch.Tensor) -> torch.Tensor:
        out = head(hidden)
        out = out / scaling if scaling else out
        return torch.tanh(out / cap) * cap if cap else out

    return logits


def needed_lengths(labels: torch.Tensor) -> list[int]:
    """Positions each row needs (B,): up to its last label that is not -100 (0 for a row with none)."""
    positions = torch.arange(1, labels.shape[1] + 1, device=labels.device)
    return ((labels != -100) * positions).amax(1).tolist()


def length_groups(lengths: list[int], copies: int, pass_tokens: int) -> list[list[int]]:
    """Rows in groups of similar length, longest first, that minimise the padded work of the passes."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    best = [0.0] + [float("inf")] * n  # best[j]: least cost of the j longest rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + copies * (j - i) * lengths[order[i]] + pass_tokens
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups, j = [], n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def batchable(gates, masks: list) -> bool:
    """Whether ``CausalMaskBatcher`` fits: a decoder-only model (one dec_self group, a dec_ffn group) and masks [L, U] (None = keep all)."""
    if not MaskBatcher.takes(gates):
        return False  # residual channels or other kinds act before the first layer the batcher replays: one forward per mask
    heads, ffn = primitive_gates(gates)
    groups_fit = (heads is None or set(heads.groups) == {CausalMaskBatcher.group}) and (
        ffn is None or set(ffn.groups) <= {CausalMaskBatcher.ffn_group}
    )
    values = [v for mask in masks if mask is not None for v in (mask.values() if isinstance(mask, dict) else [mask])]
    return groups_fit and all(torch.as_tensor(v).dim() == 2 for v in values)


class CausalMaskBatcher(MaskBatcher):
    """Per-text NLL of a decoder-only causal LM under many head masks, in batched passes (see the module doc)."""

    group = "dec_self"
    ffn_group = "dec_ffn"
    handles = "decoder-only causal LMs"

    def __init__(self, model: nn.Module, gates, max_tokens: int = 4096, head_tokens: int = 128, pass_tokens: int = 64):
        self.backbone = model.base_model  # the decoder stack and its final norm, without the LM head
        if model.get_output_embeddings() is None or self.backbone is model:
            raise ValueError(f"{type(model).__name__} is not a causal LM with an LM head (e.g. LlamaForCausalLM)")
        self.head = output_logits(model)
        super().__init__(model, gates, first_token=False)
        # token rows (masks x texts x positions) of one pass at most, and positions whose vocabulary logits exist at
        # once: small enough that a layer's activations and a logits chunk (128 x 49,152 floats = 25 MB) stay modest
        self.max_tokens, self.head_tokens = int(max_tokens), int(head_tokens)
        self.pass_tokens = int(pass_tokens)  # the fixed cost of one pass, in token rows, when texts are grouped by length

    def nll(self, batch: dict, masks) -> torch.Tensor:
        """NLL sums (M, B) in float64 on the CPU of every text (labels (B, T), -100 unscored) under each mask (a list or (M, L, H))."""
        return self.label_stats(batch, masks)[..., 0]

    @torch.inference_mode()
    def label_stats(self, batch: dict, masks) -> torch.Tensor:
        """(NLL sum, labels the argmax misses) (M, B, 2) in float64 on the CPU of every text under each mask (see ``nll``)."""
        stacked = self._stack(masks)
        inputs, labels = {k: batch[k] for k in DECODER_INPUTS}, batch["labels"]
        b = labels.shape[0]
        layers = len(self.layers)
        by_first = engine._by_first(stacked, layers)
        needed = [f - 1 for f in by_first if 0 < f < layers]  # the layer outputs some pass replays
        top = layers if layers in by_first else (needed[-1] + 1 if needed else 0)  # layers the plain pass must run
        with recorded_outputs([self.layers[i] for i in needed]) as recorded, self._gated(None), ExitStack() as stack:
            for layer in self.layers[top:]:
                stack.enter_context(engine._patched(layer, lambda hidden, *args, **kwargs: hidden))  # a layer left out: its input unchanged
            hidden = self.backbone(**inputs).last_hidden_state if top > 0 else None
        cache = dict(zip(needed, recorded))
        out = torch.zeros((engine._count(stacked), b, 2), dtype=torch.float64)  # a text with no label keeps NLL 0 and misses none
        lengths = needed_lengths(labels)
        texts = [r for r in range(b) if lengths[r] > 0]
        for first, idx in by_first.items():
            if first == layers:
                out[idx] = label_stats(hidden, labels, self.head, self.head_tokens).cpu()
                continue
            for group in length_groups([lengths[r] for r in texts], len(idx), self.pass_tokens):
                rows = [texts[g] for g in group]
                length = max(lengths[r] for r in rows)
                chunk = max(1, self.max_tokens // (len(rows) * length))
                where = torch.tensor(rows, device=labels.device)
                for start in range(0, len(idx), chunk):
                    part = idx[start : start + chunk]
                    sums = self._group_stats(inputs, labels, cache.get(first - 1), first, engine._take_masks(stacked, part), where, length)
                    out[torch.tensor(part)[:, None], torch.tensor(rows)[None, :]] = sums.cpu()
        return out

    def _group_stats(
        self, inputs: dict, labels: torch.Tensor, below, first: int, masks: dict[str, torch.Tensor], rows: torch.Tensor, length: int
    ) -> torch.Tensor:
        """(NLL sum, misses) (M, r, 2) of the texts ``rows`` cut to ``length``, under base masks {group: (M, L, U)} from ``first``."""
        m, r = engine._count(masks), rows.shape[0]

        def cut(t: torch.Tensor) -> torch.Tensor:
            """The texts ``rows`` of a (B, T, ...) tensor, cut to ``length``."""
            return t.index_select(0, rows)[:, :length] if t.dim() >= 2 else t

        part = {k: cut(v) for k, v in inputs.items()}
        replay = engine._repeat(engine._map_tensors(below, cut), m, r) if first > 0 else None  # layer first-1's output, M copies
        with self._pass(replay, first, {g: v.to(labels.device) for g, v in masks.items()}, r):
            hidden = self.backbone(**{k: engine._repeat(v, m) for k, v in part.items()}).last_hidden_state  # (M*r, length, D)
        targets = cut(labels).repeat(m, 1)
        return label_stats(hidden, targets, self.head, self.head_tokens).view(m, r, 2)
