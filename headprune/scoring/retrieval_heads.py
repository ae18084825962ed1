"""The retrieval score of every head (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context Factuality")."""

from collections.abc import Iterable
from contextlib import contextmanager
from functools import partial

import torch

from headprune.core.attention.gates import PREFIX, ensure_gated
from headprune.core.inputs import DECODER_INPUTS, eval_mode, hooks_removed
from headprune.core.site_gates import unit_groups

COPY_KEYS = ("labels", "needle_start", "needle_end")  # what a retrieval batch holds besides the model's inputs


def copy_hits(
    attention: torch.Tensor, input_ids: torch.Tensor, labels: torch.Tensor, start: torch.Tensor, end: torch.Tensor
) -> torch.Tensor:
    """Copy-paste hits (B, H) of one layer's heads from its attention weights (B, H, T, T)."""
    b, t = (start >= 0).nonzero(as_tuple=True)  # (N,): the copying steps
    rows = attention[b, :, t]  # (N, H, T): each copying step's attention, per head
    peak = rows.argmax(-1)  # (N, H)
    inside = (peak >= start[b, t, None]) & (peak < end[b, t, None])
    same = input_ids[b[:, None], peak] == labels[b, t, None]  # the peak holds the produced token
    hits = torch.zeros(attention.shape[0], attention.shape[1], dtype=torch.float64, device=attention.device)
    return hits.index_add_(0, b, (inside & same).double())


@contextmanager
def eager_attention(model):
    """Within the block the model runs eager attention (gated as before when headprune's gates route it)."""
    previous = model.config._attn_implementation or "sdpa"
    wanted = ensure_gated("eager") if previous.startswith(PREFIX) else "eager"
    if previous == wanted:
        yield
        return
    model.set_attn_implementation(wanted)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)


def retrieval_scores(model, gates, batches: Iterable[dict]) -> dict[str, torch.Tensor]:
    """Retrieval score of every head {group: [layers, heads]} (in the gates' unit: a KV group, its query heads' mean)."""
    totals = {g: torch.zeros(layers, heads, dtype=torch.float64) for g, (layers, heads) in unit_groups(gates.sites).items()}
    examples = 0

    def record(module, args, output, site, batch: dict, counts: torch.Tensor):
        """A forward hook on one attention module adding each example's hit rate of its heads to ``totals``."""
        weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
        if weights is None:
            raise ValueError(f"{type(module).__name__} returned no attention weights: the retrieval score needs eager attention")
        if not site.head_ids:
            return
        hits = copy_hits(weights.float(), batch["input_ids"], batch["labels"], batch["needle_start"], batch["needle_end"])  # (B, H)
        rate = hits / counts.clamp(min=1).unsqueeze(1).to(hits)  # per example: the share of its copied tokens
        totals[site.group][site.layer, site.head_ids] += rate.sum(0).cpu()

    with eval_mode(model), eager_attention(model), torch.inference_mode():
        for batch in batches:
            missing = [k for k in COPY_KEYS if k not in batch]
            if missing:
                raise ValueError(f"the retrieval score needs batches with {list(COPY_KEYS)}; this batch lacks {missing}")
            counts = (batch["needle_start"] >= 0).sum(1)  # (B,) copied tokens per example
            hooks = [site.core.register_forward_hook(partial(record, site=site, batch=batch, counts=counts)) for site in gates.sites]
            with hooks_removed(hooks):
                model(**{k: batch[k] for k in DECODER_INPUTS if k in batch})
            examples += int((counts > 0).sum())
    if examples == 0:
        raise ValueError("the retrieval score got no example with an answer token copied from a needle")
    return gates.scores_from_heads({g: (t / examples).float() for g, t in totals.items()})
