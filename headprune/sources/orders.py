"""The pruning orders: ``ORDERS = {name: Order}``, each one score function with one signature."""

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from headprune.scoring.importance import attention_entropy, fisher_scores, importance_scores
from headprune.scoring.order_names import ORDER_NAMES
from headprune.selection.greedy import negated_scores, random_scores


@dataclass(frozen=True)
class OrderSettings:
    """What the score functions read: the ``importance`` block, the seed and the ablation order's evaluation."""

    importance: Any  # reduce, normalize_layers, normalize_global
    seed: int
    ablation_split: str | None  # None: no ablation order here (experiment=speed)
    n_samples: int | None  # bootstrap resamples of the ablation order's own ablation run
    progress: bool = False  # a progress bar over the training batches while scoring
    duo: Any = None  # prune.duo (steps, lr, l1): the duo order's gate training
    vocab_text: tuple = ()  # prune.vocab_text: splits whose text's tokens the floor keeps
    obs_bias: bool = True  # prune.obs_bias: the obs orders re-solve a projection's bias with its kept columns
    obs_tokens: str = "uniform"  # prune.obs_tokens: how calibration tokens weigh in the obs orders' second moments


def _cached(shared: dict | None, key: str, mask, compute: Callable[[], dict]) -> dict:
    """``compute()``, kept in ``shared[key]`` when unmasked (a masked result depends on the mask)."""
    if mask is not None or shared is None:
        return compute()
    if key not in shared:
        shared[key] = compute()
    return shared[key]


def _on_training_subset(task, settings: OrderSettings, score: Callable, *args, **kwargs) -> dict:
    """``score(model, gates, the task's training subset, *args, progress=..., **kwargs)``."""
    return score(task.model, task.gates, task.importance_batches(), *args, progress=settings.progress, **kwargs)


def importance_order(task, settings: OrderSettings, mask=None, shared: dict | None = None) -> dict:
    """Head (or KV-group) importance on the task's training subset (the paper's estimator, switchable reductions)."""
    icfg = settings.importance
    options = {"reduce": str(icfg.reduce), "normalize_layers": bool(icfg.normalize_layers), "normalize_global": bool(icfg.normalize_global)}
    compute = lambda: _on_training_subset(task, settings, importance_scores, mask=mask, unit=task.gates.unit, **options)  # noqa: E731
    return _cached(shared, "importance_raw", mask, compute)


def fisher_order(task, settings: OrderSettings, mask=None, shared: dict | None = None) -> dict:
    """Empirical Fisher of each head gate on the training subset, unnormalised (comparable across layers for a cost-aware search)."""
    return _cached(shared, "fisher_raw", mask, lambda: _on_training_subset(task, settings, fisher_scores, mask=mask, unit=task.gates.unit))


def entropy_order(task, settings: OrderSettings, mask=None, shared: dict | None = None) -> dict:
    """Minus the mean attention entropy on the training subset: diffuse heads go first (a KV group: its query heads' mean)."""

    def compute():
        with task.gates.masked(mask):
            return task.gates.scores_from_heads(_on_training_subset(task, settings, attention_entropy))

    return negated_scores(_cached(shared, "entropy_raw", mask, compute))


def ablation_order(task, settings: OrderSettings, mask=None, shared: dict | None = None) -> dict:
    """The oracle: base score - score without the head, from single-head ablation on ``settings.ablation_split``."""
    if mask is not None:
        raise ValueError("the ablation order cannot be re-estimated: each step would ablate every remaining head again")
    if settings.ablation_split is None:
        raise ValueError("the ablation order needs prune.ablation_split and prune.n_samples")

    def compute():
        from headprune.measures.ablation_stage import ablation_stage

        result = ablation_stage(task, settings.ablation_split, None, settings.n_samples, settings.seed, None, progress=True)
        return {g: torch.tensor(v) for g, v in result["delta"].items()}

    return negated_scores(_cached(shared, "ablation_deltas", None, compute))


def random_order(task, settings: OrderSettings, mask=None, shared: dict | None = None) -> dict:
    """A seeded random permutation."""
    return random_scores(task.gates.groups, settings.seed)


def duo_order(task, settings: OrderSettings, mask=None, shared: dict | None = None) -> dict:
    """DuoAttention's streaming gates: alpha per unit trained by distillation from the full model with an L1 penalty."""
    from headprune.selection.duo import train_stream_gates

    if mask is not None:
        raise ValueError("the duo order cannot be re-estimated: its gates are trained once")
    duo = settings.duo
    compute = lambda: _on_training_subset(task, settings, train_stream_gates, steps=int(duo.steps), lr=float(duo.lr), l1=float(duo.l1))  # noqa: E731
    return _cached(shared, "duo_alphas", None, compute)


def retrieval_order(task, settings: OrderSettings, mask=None, shared: dict | None = None) -> dict:
    """The retrieval score (Wu et al. 2024): how often a head's attention peaks on the needle token it copies; rare retrievers go first."""
    from headprune.scoring.retrieval_heads import retrieval_scores

    if mask is not None:
        raise ValueError("the retrieval order is not re-estimated: it reads the full model's attention")
    return _cached(shared, "retrieval_raw", None, lambda: retrieval_scores(task.model, task.gates, task.retrieval_batches()))


def obs_order(task, settings: OrderSettings, mask=None, shared: dict | None = None, weighted: bool = False) -> dict:
    """Structured optimal brain surgeon: a unit's layer-output error after the optimal update of the rest (``weighted``: obs_fisher)."""
    from headprune.scoring.obs import obs_scores

    if mask is not None:
        raise ValueError("the obs order is not re-estimated: its greedy already updates each layer after every removal")
    pricing = {"weighted": weighted, "bias": settings.obs_bias, "tokens": settings.obs_tokens}
    compute = lambda: _on_training_subset(task, settings, obs_scores, task.gates.unit, **pricing)  # noqa: E731
    return _cached(shared, "obs_fisher_errors" if weighted else "obs_errors", None, compute)


ACTIONS = ("remove", "stream")  # what a gate at 0 does to a unit (prune.action)
SURGEON_ORDERS = ("obs", "obs_fisher")  # the orders that price a unit by its projection's input columns


@dataclass(frozen=True)
class Order:
    """A pruning order: its score function, whether it can be recomputed under the current mask, the actions it ranks for."""

    # scores(task, settings, mask=None, shared=None) -> {group: [L, H]}, lower = pruned first; mask: re-estimate with its heads gated off
    scores: Callable[..., dict]
    reestimable: bool  # ablation: no (one evaluation per remaining head per step); random: nothing to recompute
    actions: tuple[str, ...] = ACTIONS
    needs: str | None = None  # a per-head score the task's data must support (its TaskSpec.head_scores), None: any task


ORDERS: dict[str, Order] = {
    "importance": Order(importance_order, reestimable=True),
    "fisher": Order(fisher_order, reestimable=True),
    "ablation": Order(ablation_order, reestimable=False),
    "entropy": Order(entropy_order, reestimable=True, actions=("remove",)),
    "random": Order(random_order, reestimable=False),
    "duo": Order(duo_order, reestimable=False, actions=("stream",)),
    "retrieval": Order(retrieval_order, reestimable=False, needs="retrieval"),
    "obs": Order(obs_order, reestimable=False, actions=("remove",)),
    "obs_fisher": Order(partial(obs_order, weighted=True), reestimable=False, actions=("remove",)),
}

if tuple(ORDERS) != ORDER_NAMES:  # the settings' schema names the orders without importing them
    raise ImportError(f"headprune.scoring.order_names.ORDER_NAMES {ORDER_NAMES} differs from the orders {tuple(ORDERS)}")

ACTION_REFUSALS = {  # why an order cannot rank units for an action it does not take
    ("entropy", "stream"): (
        "the entropy order ranks heads by how diffuse their attention is, which says nothing of how far back a head looks: "
        "use importance, fisher, ablation, random or duo"
    ),
    ("duo", "remove"): "DuoAttention's gates mix full and streamed attention: prune.order=duo needs prune.action=stream",
    **{
        (order, "stream"): "the obs order prices removing a unit from its projection's inputs, and a streamed unit stays in "
        "the weights: use importance, fisher, ablation, random or duo"
        for order in SURGEON_ORDERS
    },
}


def action_refusal(order: str, action: str) -> str | None:
    """Why ``order`` cannot rank units for ``action`` (remove or stream), or None when it can."""
    if action in ORDERS[order].actions:
        return None
    return ACTION_REFUSALS.get((order, action), f"the {order} order ranks units for prune.action={list(ORDERS[order].actions)} only")


def unit_refusal(order: str, unit) -> str | None:
    """Why ``order`` cannot rank the units of ``unit`` (a kind or a joint list), or None when it can."""
    from headprune.core.unit_kinds import ablation_refusal, kinds_of

    if order == "ablation":
        return ablation_refusal(unit)
    maps = all(kind.attention_maps for kind in kinds_of(unit))
    if order == "entropy" and not maps:
        return (
            "the entropy order ranks heads by their attention entropy, and this unit holds units without attention maps: "
            "use prune.order=importance or fisher (any unit), or prune.unit=head / kv_group"
        )
    if order in SURGEON_ORDERS:
        missing = [kind.name for kind in kinds_of(unit) if not kind.surgeon_priced]
        if missing:
            return (
                f"the obs order prices units by the input columns of the projections that read them, and {', '.join(missing)} "
                "units have none: use prune.unit=head, kv_group, ffn, block, layer, hidden or a joint list of them"
            )
    if order == "retrieval" and not maps:
        return "the retrieval order reads where each head's attention peaks, and this unit holds units without attention maps"
    return None


def order_settings(cfg) -> OrderSettings:
    """What the orders read, from the ``importance`` block and (for the ablation order) the ``prune`` block."""
    prune = cfg.get("prune")  # experiment=speed has none: it orders by importance only
    return OrderSettings(
        importance=cfg.importance,
        seed=int(cfg.seed),
        ablation_split=str(prune.ablation_split) if prune else None,
        n_samples=int(prune.n_samples) if prune else None,
        progress=True,
        duo=prune.get("duo") if prune else None,
        vocab_text=tuple(str(s) for s in prune.vocab_text) if prune else (),
        obs_bias=bool(prune.obs_bias) if prune else True,
        obs_tokens=str(prune.obs_tokens) if prune else "uniform",
    )


def check_order(order: str) -> str:
    """The order name, or a ValueError listing the known ones."""
    if order not in ORDERS:
        raise ValueError(f"unknown pruning order {order!r}; choose one of {list(ORDERS)}")
    return order


def order_scores(task, order: str, settings: OrderSettings, shared: dict | None = None, mask=None) -> dict:
    """The score per head of one order (lower = pruned first); unmasked scores are kept in ``shared[order]``."""
    scores = _cached(shared, order, mask, lambda: ORDERS[check_order(order)].scores(task, settings, mask=mask, shared=shared))
    return with_floor(task, scores, settings.vocab_text)


def with_floor(task, scores: dict, text_splits: tuple = ()) -> dict:
    """``scores`` with +inf on the units their kinds never remove (a vocabulary's special and base tokens, and the tokens
    ``text_splits`` use): no order removes them; then re-ranked by each kind (a kept token's merge parts stay)."""
    from headprune.core.unit_kinds import kinds_of

    texts = task.__dict__.setdefault("_headprune_text_ids", {})  # {split: the sorted ids of its text's tokens}, once per task
    for split in text_splits:
        if split not in texts:
            texts[split] = sorted({int(t) for row in task.token_rows(split) for t in row})
    needed = [*getattr(task, "needed_token_ids", lambda: [])(), *sorted({t for split in text_splits for t in texts[split]})]
    out, tokenizer = dict(scores), getattr(task, "tokenizer", None)
    for kind in kinds_of(task.gates.unit):
        for group, fixed in kind.floor(task.gates, tokenizer, needed).items():
            if group in out:
                out[group] = out[group].float().masked_fill(fixed.to(out[group].device), float("inf"))
        out = kind.ranked_scores(task.gates, tokenizer, out)  # e.g. a kept token keeps what its tokenizer builds it from
    return out
