"""A token's score on the loss scale: what removing it adds to the mean loss per token, from smoothed counts.

Removing token t re-splits its uses into kept tokens: the mean loss per token rises by about freq(t) x mean loss (nats).
An unused token is not free: Good-Turing's unseen share n1 / N (n1: tokens used once; at least one use) is spread as a
Zipf prior 1 / rank over the non-special ids (byte-level BPE ids follow merge order, so corpus frequency), each pseudo-
count w squashed to w / (1 + w) < 1: the count ranking (ties by merge order) stays, only its scale and zero floor move.
"""

import torch


def token_loss_scores(counts: torch.Tensor, special: list[int], mean_loss: float) -> torch.Tensor:
    """(V,) the rise of the mean loss per token (nats) removing each token would cause, from its uses ``counts`` (V,)."""
    counts = counts.double().cpu()
    plain = torch.ones_like(counts, dtype=torch.bool)
    plain[[i for i in special if 0 <= i < len(counts)]] = False
    singletons = float((counts[plain] == 1).sum())  # Good-Turing: the unseen share of new text is about n1 / N
    rank = plain.double().cumsum(0)  # the rank of each non-special id, in id order (1-based)
    inverse = torch.where(plain, 1.0 / rank, torch.zeros_like(rank))
    share = max(singletons, 1.0) * inverse / inverse.sum()  # Zipf: proportional to 1 / rank, summing to the unseen uses
    smoothed = counts + share / (1.0 + share)  # each pseudo-count below one use, strictly decreasing in rank; 0 at special ids
    return smoothed / max(float(smoothed[plain].sum()), 1e-30) * mean_loss  # freq(t) x mean loss per token
