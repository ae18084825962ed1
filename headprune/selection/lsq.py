"""Retraining-free recovery after pruning: least-squares head scales per layer (Kwon et al. 2022, mask tuning).

For one attention layer with head outputs a_h (B*T, D) and output projection W_o, head h contributes

    c_h = a_h @ W_o[:, cols_h]^T                      (B*T, hidden)

We solve, over the kept heads, min_s || sum_h s_h c_h - y ||^2 + lam || s - 1 ||^2 where y is the
unpruned (teacher) layer's sum over all its heads on the same examples, with
lam = ridge * mean(diag(C^T C)) (the pull towards s = 1 keeps ill-posed layers where they were),
and fold each s_h into W_o[:, cols_h]. The pruned model stays a plain HF model: it saves and loads
like any other, and the scales survive ``prune_mask`` of a masked model.

Layers are tuned sequentially, in forward order, on the pruned model's own inputs: when a layer is
fitted, the layers before it are already pruned and rescaled, so each layer also corrects the error
that reaches it from below (better than fitting every layer on the unpruned model's inputs). The
teacher never changes, so its targets y of every layer come from one forward per batch, kept while
they fit in ``max_cache_bytes`` (else each layer runs the teacher again, as the student does).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from headprune.core.gates import AttentionSite, HeadGates
from headprune.core.inputs import decoder_valid, model_inputs
from headprune.core.projections import linear_weight, out_features, scale_input_heads
from headprune.core.pruning import pruning_record


class _Stop(Exception):
    """Raised by a capture hook to end a forward pass once the wanted layer has run."""


def _captured_inputs(model: nn.Module, sites: list[AttentionSite], batch: dict, stop: bool = False) -> dict[int, torch.Tensor]:
    """{id(site): the input (B, T, heads * head_dim) of its output projection} in forward order; ``stop`` ends the pass early."""
    store: dict[int, torch.Tensor] = {}
    handles = []
    for site in sites:

        def hook(module, args, output, key=id(site)):  # noqa: B008 - the key is bound per site
            store.setdefault(key, args[0].detach())
            if stop and len(store) == len(sites):
                raise _Stop

        handles.append(site.linear("output").register_forward_hook(hook))
    try:
        model(**model_inputs(model, batch))
    except _Stop:
        pass
    finally:
        for handle in handles:
            handle.remove()
    return store


def _valid_tokens(site: AttentionSite, batch: dict, x: torch.Tensor) -> torch.Tensor:
    """Bool (B, T): the real (not padding) tokens of a layer's queries."""
    valid = batch.get("attention_mask") if site.group == "enc_self" else decoder_valid(batch)
    if valid is None or tuple(valid.shape) != tuple(x.shape[:2]):
        return torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
    return valid.to(x.device).bool()


def head_contributions(x: torch.Tensor, output: nn.Linear, positions: list[int], head_dim: int) -> torch.Tensor:
    """Each listed head's share of the output projection (N, K, hidden), from its input rows x (N, width)."""
    heads = x.shape[-1] // head_dim
    a = x.reshape(-1, heads, head_dim)[:, positions]  # (N, K, D)
    w = linear_weight(output).reshape(out_features(output), heads, head_dim)[:, positions]  # (hidden, K, D)
    return torch.einsum("nkd,okd->nko", a, w)


def _teacher_of(model: nn.Module, gates: HeadGates, teacher: nn.Module | None):
    """The unpruned reference model and its gates (a copy of ``model`` when it has no heads removed yet)."""
    if teacher is None:
        if pruning_record(model):
            raise ValueError(
                "this model already has heads removed from its weights: pass teacher=<the unpruned model> "
                "(lsq fits each pruned layer to the unpruned layer's output)"
            )
        teacher = copy.deepcopy(model)
    teacher_gates = HeadGates(teacher)
    teacher_gates.set_mask(None)
    return teacher.eval(), teacher_gates


def _solve(gram: torch.Tensor, rhs: torch.Tensor, ridge: float, max_scale: float) -> torch.Tensor:
    """argmin_s ||C s - y||^2 + lam ||s - 1||^2 from C^T C and C^T y, clamped to [-max_scale, max_scale]."""
    k = gram.shape[0]
    lam = ridge * float(gram.diagonal().mean())
    if lam <= 0:
        return torch.ones(k, dtype=gram.dtype)  # the kept heads contribute nothing: leave them
    eye = torch.eye(k, dtype=gram.dtype)
    scales = torch.linalg.solve(gram + lam * eye, rhs + lam * torch.ones(k, dtype=gram.dtype))
    return scales.clamp(-max_scale, max_scale)


def _kept_positions(site: AttentionSite, mask) -> list[int]:
    """Weight positions of the heads of a site that are present and kept by ``mask`` (None keeps all present)."""
    if mask is None or site.group not in mask:
        return list(range(len(site.head_ids)))
    row = mask[site.group][site.layer]
    return [p for p, head in enumerate(site.head_ids) if float(row[head]) != 0]


@torch.no_grad()
def lsq_recover(
    model: nn.Module,
    gates: HeadGates,
    batches: Iterable[dict],
    teacher: nn.Module | None = None,
    mask=None,
    ridge: float = 1e-3,
    max_scale: float = 10.0,
    max_cache_bytes: int = 2**30,
    progress: bool = False,
) -> dict[str, torch.Tensor]:
    """Rescale the kept heads of every layer by least squares and fold the scales into the output projections.

    ``model`` is either physically pruned (pass ``teacher``, the unpruned model) or whole and gated by ``mask``
    (the teacher is then a copy of it before recovery). ``batches`` are model inputs from the training data;
    the teacher's targets are computed once when they fit in ``max_cache_bytes`` (0: never cached).
    Returns the scales {group: [layers, heads]} (1 for heads not kept).
    """
    batches = list(batches)
    if not batches:
        raise ValueError("lsq_recover got no batches: give a few training batches (model inputs)")
    teacher, teacher_gates = _teacher_of(model, gates, teacher)
    mask = gates.normalize_mask(mask) if mask is not None else None
    if mask is not None and any(m.dim() != 2 for m in mask.values()):
        raise ValueError("lsq_recover needs one mask for the whole model ({group: [layers, heads]}), not one per example")
    scales = {g: torch.ones(layers, heads) for g, (layers, heads) in gates.groups.items()}
    was_training = model.training
    model.eval()
    try:
        with gates.masked(mask) if mask is not None else nullcontext():
            forward_order = _captured_inputs(model, gates.sites, batches[0])
            order = sorted(gates.sites, key=lambda s: list(forward_order).index(id(s)))
            targets = _teacher_targets(teacher, teacher_gates, batches, max_cache_bytes)
            for site in _progress(order, progress):
                positions = _kept_positions(site, mask)
                if not positions:
                    continue
                teacher_site = teacher_gates.site(site.group, site.layer)
                s = _fit_site(model, site, teacher, teacher_site, positions, batches, ridge, max_scale, targets)
                scale_input_heads(site.linear("output"), positions, site.head_dim, s)
                scales[site.group][site.layer, [site.head_ids[p] for p in positions]] = s.float()
    finally:
        model.train(was_training)
    return scales


def _progress(sites: list, enabled: bool):
    """The sites in order, with a progress bar over the layers fitted when ``enabled``."""
    if not enabled:
        return sites
    from tqdm.auto import tqdm

    return tqdm(sites, desc="lsq recovery", unit="layer", leave=False)


def _target(teacher_site: AttentionSite, batch: dict, x_teacher: torch.Tensor) -> torch.Tensor:
    """The teacher layer's sum over all its heads at the real tokens, y (N, hidden), without the bias."""
    return F.linear(x_teacher[_valid_tokens(teacher_site, batch, x_teacher)], linear_weight(teacher_site.linear("output")))


def _teacher_targets(teacher, teacher_gates: HeadGates, batches: list[dict], max_cache_bytes: int) -> dict | None:
    """{(id(teacher site), batch index): y} from one teacher forward per batch, or None when it would pass the limit."""
    sites = teacher_gates.sites
    tokens = sum(max(int(v.numel()) for v in b.values() if torch.is_tensor(v) and v.dim() == 2) for b in batches)  # a bound
    hidden = max(out_features(site.linear("output")) for site in sites)
    if tokens * hidden * len(sites) * 4 > max_cache_bytes:
        return None
    targets = {}
    for index, batch in enumerate(batches):
        inputs = _captured_inputs(teacher, sites, batch)
        for site in sites:
            targets[id(site), index] = _target(site, batch, inputs[id(site)])
    return targets


def _fit_site(model, site, teacher, teacher_site, positions, batches, ridge, max_scale, targets=None) -> torch.Tensor:
    """The least-squares scales of one layer's kept heads against the teacher layer's output (``targets``: cached y)."""
    gram = torch.zeros(len(positions), len(positions), dtype=torch.float64)
    rhs = torch.zeros(len(positions), dtype=torch.float64)
    for index, batch in enumerate(batches):
        x = _captured_inputs(model, [site], batch, stop=True)[id(site)]
        if targets is None:
            target = _target(teacher_site, batch, _captured_inputs(teacher, [teacher_site], batch, stop=True)[id(teacher_site)])
        else:
            target = targets[id(teacher_site), index]
        target = target.double()  # (N, hidden)
        valid = _valid_tokens(site, batch, x)
        contributions = head_contributions(x[valid], site.linear("output"), positions, site.head_dim).double()  # (N, K, hidden)
        gram += torch.einsum("nko,njo->kj", contributions, contributions).cpu()
        rhs += torch.einsum("nko,no->k", contributions, target).cpu()
    return _solve(gram, rhs, ridge, max_scale)


@torch.no_grad()
def layer_output_errors(
    model: nn.Module, gates: HeadGates, teacher: nn.Module, batches: Iterable[dict], mask=None
) -> dict[str, torch.Tensor]:
    """Relative squared error ||out - out_teacher||^2 / ||out_teacher||^2 of every attention layer's output projection.

    Returns {group: [layers]} over the valid tokens of ``batches``; the model runs under ``mask`` when given.
    """
    teacher_gates = HeadGates(teacher)
    errors = {g: torch.zeros(layers, dtype=torch.float64) for g, (layers, _) in gates.groups.items()}
    norms = {g: torch.zeros(layers, dtype=torch.float64) for g, (layers, _) in gates.groups.items()}
    was_training = model.training
    model.eval(), teacher.eval()
    try:
        with gates.masked(mask) if mask is not None else nullcontext():
            for batch in batches:
                student = _captured_inputs(model, gates.sites, batch)
                reference = _captured_inputs(teacher, teacher_gates.sites, batch)
                for site, teacher_site in zip(gates.sites, teacher_gates.sites):
                    x = student[id(site)]
                    valid = _valid_tokens(site, batch, x)
                    out = F.linear(x[valid], linear_weight(site.linear("output"))).double()
                    ref = F.linear(reference[id(teacher_site)][valid], linear_weight(teacher_site.linear("output"))).double()
                    errors[site.group][site.layer] += float((out - ref).pow(2).sum())
                    norms[site.group][site.layer] += float(ref.pow(2).sum())
    finally:
        model.train(was_training)
    return {g: errors[g] / norms[g].clamp(min=1e-30) for g in errors}


def lsq_recoverer(ridge: float = 1e-3, max_scale: float = 10.0):
    """A ``recover(model, teacher, batches)`` step for ``headprune.selection.schedule.iterative_prune``."""

    def recover(model, teacher, batches):
        lsq_recover(model, HeadGates(model), batches, teacher=teacher, ridge=ridge, max_scale=max_scale)

    return recover
