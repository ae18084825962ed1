"""Generation under a cut vocabulary: a removed token's logit is 0 (a zeroed row), never a token to emit."""

import torch
from transformers import LogitsProcessor, LogitsProcessorList

from headprune.core.site_gates import broadcast_unit_gate
from headprune.core.vocab.rows import SITE_ATTR, input_embedding


def removed_tokens(site, scores: torch.Tensor) -> torch.Tensor | None:
    """(rows, vocabulary) or (vocabulary,) True at the tokens ``site``'s mask or pruning removed, as ``scores`` index them."""
    gate, view = site.gate, site.old_to_new
    if view is None:  # the scores index the site's units: an unpruned model's ids, or a pruned model's new ones
        return None if gate is None else gate.to(scores.device) == 0
    view = view.to(scores.device)  # a pruned model read through original ids: the new id of each, -1 at a removed one
    masked = False if gate is None else gate.to(scores.device)[..., view.clamp(min=0)] == 0  # a mask on the kept ids too
    return (view < 0) | masked


class RemovedTokens(LogitsProcessor):
    """Sets the scores of removed tokens to -inf, so search neither emits them nor spends probability on them."""

    def __init__(self, site):
        self.site = site

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        removed = removed_tokens(self.site, scores)  # per example (B, V): beams repeat each example's row
        return scores if removed is None else scores.masked_fill(broadcast_unit_gate(removed, scores).bool(), float("-inf"))


def removed_token_processors(model) -> LogitsProcessorList:
    """``generate``'s logits processors for a model whose vocabulary is masked or pruned (none for another model)."""
    site = getattr(input_embedding(model), SITE_ATTR, None)
    return LogitsProcessorList([] if site is None else [RemovedTokens(site)])
