"""How the scores of different kinds meet under one budget: a joint unit (``[head, ffn]``, ``[kv_group, ffn]``).

The cost-aware search removes the unit of lowest score per unit of cost saved (a knapsack by ratio), and a fraction
removes the lowest scores: across kinds, both compare a head's score with a neuron's. Two rules (``prune.joint_scale``):

    loss      the scores as they are: each estimates the loss increase of removing its unit, in the same units for
              every kind (Kwon et al. 2022 rank heads and neurons by their raw Fisher under one FLOPs or latency
              budget). Right for orders in loss units: fisher, and importance unnormalised.
    relative  each kind's scores over the kind's mean score per unit of cost:  s'_u = s_u C_k / S_k,  S_k the sum of
              the kind's scores, C_k the cost its units can remove (FLOPs or seconds of the cost model for a target,
              one per unit for a fraction). Every kind's mean score per unit of cost is then 1: a kind's scale (a
              constant factor on all its scores) cannot decide, only how each unit stands within its kind.

``relative`` is the rule when the scores are not in loss units across kinds: importance normalised per layer (its
default, Michel et al.) gives each layer's heads or KV groups the norm 1 whatever the loss, beside raw neuron scores.
"""

from __future__ import annotations

import torch

from headprune.core.unit_kinds import group_kind

JOINT_SCALES = ("relative", "loss")


def kind_classes(groups) -> dict[str, list[str]]:
    """{kind: its groups} of a score dict's groups; heads and KV groups (the attention groups) are one class."""
    out: dict[str, list[str]] = {}
    for group in groups:
        out.setdefault(group_kind(str(group)) or "head", []).append(group)
    return out


def removable_cost(costs, groups: list[str], present: dict[str, torch.Tensor] | None = None) -> float:
    """What removing every (present) unit of ``groups`` saves in the cost model: each layer down to its emptied entry."""
    total = 0.0
    for g in groups:
        table = costs.tables[g]
        kept = table.shape[1] - 1 if present is None else present[g].ne(0).sum(-1).long().cpu()
        total += float((table[torch.arange(table.shape[0]), kept] - table[:, 0]).sum())
    return total


def comparable_scores(scores: dict[str, torch.Tensor], rule: str, costs=None, present=None) -> dict[str, torch.Tensor]:
    """``scores`` ({group: [L, U]}) made comparable across the kinds they hold by ``rule`` (see the module doc).

    ``costs``: the CostModel of the budget (a target's search), or None for a count of units (a fraction); ``present``
    ({group: 0/1 [L, U]}, a model already pruned): the means run over the units still there. One kind: returned as they
    are. ``relative`` needs scores >= 0 in every kind (every order a joint unit takes gives them).
    """
    if rule not in JOINT_SCALES:
        raise ValueError(f"prune.joint_scale must be one of {list(JOINT_SCALES)}, got {rule!r}")
    classes = kind_classes(scores)
    if rule == "loss" or len(classes) < 2:
        return scores
    out = dict(scores)
    for kind, groups in classes.items():
        values = [scores[g].detach().double().cpu() for g in groups]
        if any(bool((v < 0).any()) for v in values):
            raise ValueError(
                f"prune.joint_scale=relative divides each kind's scores by their mean, and the {kind} scores hold negative "
                "values: give an order whose scores are >= 0 (importance, fisher, random)"
            )
        total = sum(float(v.sum()) for v in values)  # units already removed score 0
        if costs is not None:
            cost = removable_cost(costs, groups, present)
        else:
            cost = float(sum(v.numel() if present is None else int(present[g].ne(0).sum()) for g, v in zip(groups, values)))
        if total > 0 and cost > 0:
            out.update({g: (v * (cost / total)).to(scores[g].dtype) for g, v in zip(groups, values)})
    return out
