"""How the scores of different kinds meet under one budget: a joint unit (``[head, ffn]``, ``[kv_group, ffn]``)."""

import torch

from headprune.core.unit_kinds import kind_of_group

JOINT_SCALES = ("relative", "loss")


def kind_classes(groups) -> dict[str, list[str]]:
    """{kind: its groups} of a score dict's groups; heads and KV groups (the attention groups) are one class."""
    out: dict[str, list[str]] = {}
    for group in groups:
        out.setdefault(kind_of_group(group).name, []).append(group)
    return out


def removable_cost(costs, groups: list[str], present: dict[str, torch.Tensor] | None = None) -> float:
    """What removing every (present) unit of ``groups`` saves in the cost model: each layer down to its emptied entry."""
    kept, total = costs.kept_counts(present), 0.0  # {group: [layers] units kept}: every unit where ``present`` is None
    for g in groups:
        table = costs.tables[g]
        total += float((table[torch.arange(table.shape[0]), kept[g]] - table[:, 0]).sum())
    return total


def comparable_scores(scores: dict[str, torch.Tensor], rule: str, costs=None, present=None) -> dict[str, torch.Tensor]:
    """``scores`` ({group: [L, U]}) made comparable across the kinds they hold by ``rule`` (see the module doc)."""
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
        total = sum(float(v[v.isfinite()].sum()) for v in values)  # units already removed score 0; +inf (a floor) stays
        if costs is not None:
            cost = removable_cost(costs, groups, present)
        else:
            cost = float(sum(v.numel() if present is None else int(present[g].ne(0).sum()) for g, v in zip(groups, values)))
        if total > 0 and cost > 0:
            out.update({g: (v * (cost / total)).to(scores[g].dtype) for g, v in zip(groups, values)})
    return out
