"""Head importance (Michel et al. 2019, section 4.1) and attention entropy per head."""

from collections.abc import Callable, Iterable
from contextlib import nullcontext

import torch
import torch.nn.functional as F

from headprune.core.checks import ConfigError
from headprune.core.inputs import eval_mode, group_valid, model_inputs
from headprune.core.unit_kinds import KINDS, kind_of_group, kinds_of
from headprune.core.units import unit_gates

# a unit's share of a batch from its contributions (B, T, U), dL(x_b)/d xi_u restricted to token t: summing the probes over t
# gives dL(x)/d xi_h, so I_h = E_x |dL(x)/d xi_h| (example) and F_h = E_x (dL(x)/d xi_h)^2 (fisher)
REDUCE = {
    "example": lambda c: c.sum(1).abs().sum(0),
    "token": lambda c: c.abs().sum(1).sum(0),
    "batch": lambda c: c.sum((0, 1)).abs(),  # of the batch-mean loss's gradient
    "fisher": lambda c: c.sum(1).pow(2).sum(0),
}
REDUCTIONS = tuple(REDUCE)


def _require_labels(batch: dict) -> None:
    if "labels" not in batch:
        raise ValueError(
            f"the per-example loss needs each batch's labels (the targets), but the batch holds only {sorted(batch)}: "
            "add labels to the batches, or pass loss_fn=<your per-example loss>"
        )


def per_example_loss(outputs, batch: dict) -> torch.Tensor:
    """Cross-entropy per example (B,): per sequence for classifiers, mean over target tokens for seq2seq."""
    _require_labels(batch)
    logits, labels = outputs.logits, batch["labels"]
    logits = logits if logits.dtype == torch.float64 else logits.float()
    if logits.dim() == 2:
        return F.cross_entropy(logits, labels, reduction="none")
    token_loss = F.cross_entropy(logits.transpose(1, 2), labels, reduction="none", ignore_index=-100)  # (B, T)
    valid = (labels != -100).float()
    return (token_loss * valid).sum(1) / valid.sum(1).clamp(min=1)


def _kinds(unit: str):
    """The kinds of an importance unit, or a ValueError listing the kinds."""
    try:
        return kinds_of(unit)
    except ValueError:
        raise ValueError(f"importance unit must be one of {list(KINDS)} or a joint list of them, got {unit!r}") from None


def _unit_gradients(model, gates, batch: dict, loss_fn: Callable, unit: str, mean: bool = False) -> tuple[torch.Tensor, list]:
    """(losses (B,), [(site, gradients per unit (B, T, U), unit ids, group)]) of one batch's summed (``mean``: averaged) loss."""
    losses = loss_fn(model(**model_inputs(model, batch)), batch)  # (B,)
    probes = [probe for site in gates.sites for probe in site.probes]
    grads = torch.autograd.grad(losses.mean() if mean else losses.sum(), probes, allow_unused=True) if probes else ()  # the probes' only
    grad_of = dict(zip(map(id, probes), grads))
    found = []
    for site in gates.sites:
        for probe in site.probes:
            grad = grad_of[id(probe)]
            if grad is None or not getattr(site, "has_units", True):  # a site that holds no unit
                continue
            grad = grad.double().reshape(losses.shape[0], -1, grad.shape[-1])  # OPT's flattened tokens: (B * T, W) -> (B, T, W)
            # per unit: (gradients (B, T, U), original unit ids, group)
            per_unit = next((got for kind in _kinds(unit) if (got := kind.unit_grad(site, grad)) is not None), None)
            if per_unit is not None:
                found.append((site, *per_unit))
        site.probes.clear()
    return losses, found


def importance_scores(
    model,
    gates,
    batches: Iterable[dict],
    loss_fn: Callable = per_example_loss,
    reduce: str = "example",
    normalize_layers: bool = True,
    normalize_global: bool = False,
    mask=None,
    progress: bool = False,
    unit: str = "head",
) -> dict[str, torch.Tensor]:
    """Importance of every head {group: [layers, heads]} on ``batches`` (training data, never the eval set)."""
    if reduce not in REDUCTIONS:
        raise ValueError(f"importance reduce must be one of {REDUCTIONS}, got {reduce!r}")
    _kinds(unit)
    totals = {g: torch.zeros(layers, heads, dtype=torch.float64) for g, (layers, heads) in unit_gates(gates, unit).groups.items()}
    count, examples, loss_total = 0, 0, 0.0
    batches = _progress(batches, progress, "fisher" if reduce == "fisher" else "importance")
    with eval_mode(model), gates.masked(mask) if mask is not None else nullcontext(), gates.probing(), torch.enable_grad():
        for batch in batches:
            if loss_fn is per_example_loss:
                _require_labels(batch)
            losses, found = _unit_gradients(model, gates, batch, loss_fn, unit, mean=reduce == "batch")  # batch: of the batch-MEAN loss
            for site, contribution, ids, group in found:  # contribution (B, T, U)
                totals[group][site.layer, ids] += REDUCE[reduce](contribution).cpu()
            count += losses.shape[0] if reduce != "batch" else 1
            examples, loss_total = examples + losses.shape[0], loss_total + float(losses.detach().sum())
    if count == 0:
        raise ValueError("importance_scores got no batches: the importance subset is empty")
    scores = {g: t / count for g, t in totals.items()}
    for site in gates.sites:  # a kind that counts its units' uses (tokens) prices them on the loss scale itself
        found = next((c for kind in _kinds(unit) if (c := kind.counted_scores(gates, site, loss_total / examples)) is not None), None)
        if found is not None:
            values, ids, group = found
            scores[group][site.layer, ids] = values.cpu().double()
    scores = {g: t.float() for g, t in scores.items()}
    if normalize_layers:  # L2-normalise each attention layer's head (or KV-group) scores
        scores.update({g: s / (s.norm(dim=-1, keepdim=True) + 1e-20) for g, s in scores.items() if kind_of_group(g).layer_normalized})
    if normalize_global:  # then min-max over the whole network
        flat = torch.cat([s.reshape(-1) for s in scores.values()])
        low, high = flat.min(), flat.max()
        scores = {g: (s - low) / (high - low + 1e-20) for g, s in scores.items()}
    return scores


def fisher_scores(model, gates, batches: Iterable[dict], *, normalize_layers: bool = False, **options) -> dict[str, torch.Tensor]:
    """Empirical Fisher of every gate, mean over examples of (dL(x)/d xi_h)^2: {group: [layers, heads]} (importance_scores' options)."""
    return importance_scores(model, gates, batches, reduce="fisher", normalize_layers=normalize_layers, **options)


def per_example_gate_gradients(
    model, gates, batch: dict, loss_fn: Callable = per_example_loss, mask=None, unit: str = "head"
) -> dict[str, torch.Tensor]:
    """Signed dL(x_b)/d xi_h for every example of one batch: {group: [B, layers, heads]} (``kv_group``: [B, layers, KV]; ``ffn``: [B, layers, neurons])."""
    model.eval()
    with gates.masked(mask) if mask is not None else nullcontext(), gates.probing(), torch.enable_grad():
        losses, found = _unit_gradients(model, gates, batch, loss_fn, unit)
    shape = unit_gates(gates, unit).groups
    out = {g: torch.zeros(losses.shape[0], layers, heads, dtype=torch.float64) for g, (layers, heads) in shape.items()}
    for site, contribution, ids, group in found:
        out[group][:, site.layer, ids] += contribution.sum(1).cpu()
    return out


class _EntropyRecorder:
    """Accumulates the mean entropy of each head's attention distribution over valid query tokens."""

    def __init__(self, gates):
        from headprune.core.site_gates import unit_groups

        shape = unit_groups(gates.sites)  # per query head, whatever unit the gates are seen in
        self.totals = {g: torch.zeros(layers, heads, dtype=torch.float64) for g, (layers, heads) in shape.items()}
        self.counts = {g: t.clone() for g, t in self.totals.items()}
        self.batch: dict = {}  # the batch of the forward pass that runs

    def __call__(self, site, query, key, attention_mask, scaling, bias=None):
        scale = scaling if scaling is not None else query.shape[-1] ** -0.5
        scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale  # (B, H, Tq, Tk)
        if bias is not None:
            scores = scores + bias.float()  # additive per-head score bias (T5's relative positions)
        if attention_mask is not None:
            if attention_mask.dtype == torch.bool:
                scores = scores.masked_fill(~attention_mask, float("-inf"))
            else:
                scores = scores + attention_mask.float()
        elif getattr(site.core, "is_causal", False) and scores.shape[-2] > 1:
            tq, tk = scores.shape[-2:]
            causal = torch.ones(tq, tk, dtype=torch.bool, device=scores.device).tril(tk - tq)
            scores = scores.masked_fill(~causal, float("-inf"))
        log_p = torch.log_softmax(scores, dim=-1)
        entropy = -(log_p.exp() * log_p.nan_to_num(neginf=0.0)).sum(-1)  # (B, H, Tq)
        valid = group_valid(site.group, self.batch)
        if valid is None or valid.shape != (entropy.shape[0], entropy.shape[-1]):
            valid = torch.ones(entropy.shape[0], entropy.shape[-1], device=entropy.device)
        valid = valid.to(entropy.device, entropy.dtype).unsqueeze(1)  # (B, 1, Tq)
        if site.head_ids:
            self.totals[site.group][site.layer, site.head_ids] += (entropy * valid).sum((0, 2)).double().cpu()
            self.counts[site.group][site.layer, site.head_ids] += valid.sum().double().cpu()


def attention_entropy(model, gates, batches: Iterable[dict], progress: bool = False) -> dict[str, torch.Tensor]:
    """Mean attention entropy (nats) of every query head {group: [layers, heads]}; low = peaked attention."""
    recorder = _EntropyRecorder(gates)
    for site in gates.sites:
        site.entropy_hook = recorder
    try:
        with eval_mode(model), torch.inference_mode():
            for batch in _progress(batches, progress, "entropy"):
                recorder.batch = batch
                model(**batch)
    finally:
        for site in gates.sites:
            site.entropy_hook = None
    if recorder.batch and not any(bool(c.any()) for c in recorder.counts.values()):
        raise ConfigError(
            f"attention entropy reads each head's attention inside transformers' attention interface, and no attention of "
            f"{type(model).__name__} went through it (heads gated at the output projection, e.g. DeBERTa-v2): "
            "use another order (prune.order=importance, fisher, ablation or random)"
        )
    return {g: (recorder.totals[g] / recorder.counts[g].clamp(min=1)).float() for g in recorder.totals}


def _progress(iterable, enabled: bool, desc: str):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=f"{desc} (training batches)", unit="batch", leave=False)
