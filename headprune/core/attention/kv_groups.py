"""KV groups: a KV head with all of its query heads, seen through the query-head gates (grouped-query attention)."""

import torch

from headprune.core.masks import kv_to_head_mask
from headprune.core.site_gates import SharedGates


class KVGroupGates(SharedGates):
    """HeadGates seen in KV-group units: masks and scores are {group: [layers, KV heads]}."""

    unit, noun = "kv_group", "head"  # the query heads' noun in mask messages

    def __init__(self, heads):
        self.heads = heads  # the HeadGates of the model (query-head unit)

    @property
    def shared(self) -> dict:
        """{"head": the query-head gates}: the gates that act."""
        return {"head": self.heads}

    def __getattr__(self, name):  # sites, inner, probing, kv_groups, describe, ...: the query-head gates' own
        return getattr(self.heads, name)

    @property
    def groups(self) -> dict[str, tuple[int, int]]:
        """{group: (layers, KV heads per layer in the original model)}."""
        return self.heads.kv_groups

    def present(self) -> dict[str, torch.Tensor]:
        """{group: bool [layers, KV heads]}: True where any query head of the KV group is still in the weights."""
        n = self.heads.heads_per_kv
        return {g: p.unflatten(-1, (-1, n[g])).any(-1) for g, p in self.heads.present().items()}

    def head_mask(self, mask, hard: bool = False) -> dict[str, torch.Tensor]:
        """The query-head mask of a KV-group mask: each KV group's gate on all of its query heads."""
        return kv_to_head_mask(self.normalize_mask(mask, hard=hard), self.heads.heads_per_kv)

    def base_masks(self, mask, hard: bool = False) -> dict[str, dict[str, torch.Tensor]]:
        """{"head": the query-head mask of a KV-group mask}."""
        return {"head": self.head_mask(mask, hard=hard)}

    def scores_from_heads(self, scores: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Per-KV-group scores from per-query-head scores {group: [L, H]}: the mean of each group's query heads."""
        n = self.heads.heads_per_kv
        return {g: s.unflatten(-1, (-1, n[g])).mean(-1) for g, s in scores.items()}
