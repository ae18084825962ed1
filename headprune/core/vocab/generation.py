"""Generation under a cut vocabulary: a removed token's logit is 0 (a zeroed row), never a token to emit."""

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from headprune.core.vocab.rows import SITE_ATTR, beam_rows, input_embedding


def removed_tokens(site, scores: torch.Tensor) -> torch.Tensor | None:
    """(rows, vocabulary) or (vocabulary,) True at the tokens ``site``'s mask or pruning removed, as ``scores`` index them."""
    gate, view = site.gate, site.old_to_new
    if view is None:  # the scores index the site's units: an unpruned model's ids, or a pruned model's new ones
        return None if gate is None else gate.to(scores.device) == 0
    removed = (view < 0).to(scores.device)  # a pruned model read through original ids
    if gate is not None:  # a mask on the kept ids too: spread over the original ids
        ids = torch.tensor(site.unit_ids, device=scores.device)
        full = torch.ones(*gate.shape[:-1], site.units_orig, device=scores.device)
        removed = removed | (full.index_copy(-1, ids, gate.to(full)) == 0)
    return removed


class RemovedTokens(LogitsProcessor):
    """Sets the scores of removed tokens to -inf, so search neither emits them nor spends probability on them."""

    def __init__(self, site):
        self.site = site

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        removed = removed_tokens(self.site, scores)
        if removed is None:
            return scores
        if removed.dim() == 2:  # per-example rows; beams repeat each example's row
            removed = beam_rows(removed, scores.shape[0])
        return scores.masked_fill(removed, float("-inf"))


def removed_token_processors(model) -> LogitsProcessorList:
    """``generate``'s logits processors for a model whose vocabulary is masked or pruned (none for another model)."""
    site = getattr(input_embedding(model), SITE_ATTR, None)
    return LogitsProcessorList([] if site is None else [RemovedTokens(site)])
