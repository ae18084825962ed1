"""Retraining-free recovery after pruning (Kwon et al. 2022, mask tuning): least-squares head scales per layer, neuron scales per block."""

import copy
from collections.abc import Callable, Iterable
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn

from headprune.core.ffn.pruning import ffn_record
from headprune.core.ffn.sites import FFNSite
from headprune.core.inputs import eval_mode, group_valid, model_inputs
from headprune.core.kinds.gates_protocol import Gates
from headprune.core.projections import linear_weight, out_features, scale_input_heads
from headprune.core.pruning import pruning_record
from headprune.core.units import FFN, QUERY_HEADS, refit_gates, unit_gates
from headprune.scoring.importance import per_example_loss
from headprune.selection.layer_replay import captured_pass

SHRINKS = (1.0, 0.5, 0.25, 0.0)  # the fractions of the least-squares deviations s - 1 tried; 0 = the mask alone


def head_contributions(x: torch.Tensor, output: nn.Linear, positions: list[int], head_dim: int, x_positions=None) -> torch.Tensor:
    """Each listed head's share of the output projection (N, K, hidden) from its input rows x (N, width) at ``x_positions``."""
    a = x.reshape(x.shape[0], -1, head_dim)[:, positions if x_positions is None else x_positions]  # (N, K, D)
    heads = linear_weight(output).shape[1] // head_dim
    w = linear_weight(output).reshape(out_features(output), heads, head_dim)[:, positions]  # (hidden, K, D)
    return torch.einsum("nkd,okd->nko", a, w)  # c_h = a_h @ W_o[:, cols_h]^T, (N, K, hidden)


def ridge_solve(gram: torch.Tensor, rhs: torch.Tensor, ridge: float, max_scale: float) -> torch.Tensor:
    """argmin_s ||C s - y||^2 + lam ||s - 1||^2 from C^T C and C^T y, lam = ridge * mean(diag), clamped to [-max_scale, max_scale]."""
    k = gram.shape[0]
    lam = ridge * float(gram.diagonal().mean())
    if lam <= 0:
        return torch.ones(k, dtype=gram.dtype)  # the kept units contribute nothing: leave them
    eye = torch.eye(k, dtype=gram.dtype)
    scales = torch.linalg.solve(gram + lam * eye, rhs + lam * torch.ones(k, dtype=gram.dtype))
    return scales.clamp(-max_scale, max_scale)


def kept_positions(site, mask) -> list[int]:
    """Weight positions of a site's units (heads, neurons) that are present and kept by ``mask`` (None keeps all present)."""
    if mask is None or site.group not in mask:
        return list(range(len(site.unit_ids)))
    row = mask[site.group][site.layer]
    return [p for p, unit in enumerate(site.unit_ids) if float(row[unit]) != 0]


def fit_inputs(
    name: str, model: nn.Module, gates: Gates, batches: Iterable[dict], mask, teacher: nn.Module | None, neurons: bool = False
) -> tuple[list[dict], dict | None, nn.Module, Gates]:
    """(the batches as a list, the mask checked against ``gates``, the unpruned reference model, its gates) of a least-squares
    fit ``name``; a ValueError where one is unfit. The reference is ``teacher``, else (none of the model's units left its
    weights) the model itself, or for ``neurons`` (fitted block after block) a copy of it with its FFN gates ungated."""
    batches = list(batches)
    if not batches:
        raise ValueError(f"{name} got no batches: give a few training batches (model inputs)")
    mask = gates.normalize_mask(mask) if mask is not None else None
    if mask is not None and any(m.dim() != 2 for m in mask.values()):
        raise ValueError(f"{name} needs one mask for the whole model ({{group: [layers, units]}}), not one per example")
    if teacher is None:
        units, part, record = ("FFN neurons", "block", ffn_record) if neurons else ("heads", "layer", pruning_record)
        if record(model):
            raise ValueError(
                f"this model already has {units} removed from its weights: pass teacher=<the unpruned model> "
                f"(lsq fits each pruned {part} to the unpruned {part}'s output)"
            )
        if not neurons:
            return batches, mask, model, gates
        teacher = copy.deepcopy(model)
    reference = unit_gates(teacher, gates.unit if neurons else QUERY_HEADS)  # neurons: the same kind's gates on the teacher
    if neurons:
        reference.set_mask(None)
    return batches, mask, teacher.eval(), reference


@torch.no_grad()
def lsq_recover(
    model: nn.Module,
    gates: Gates,
    batches: Iterable[dict],
    teacher: nn.Module | None = None,
    mask=None,
    ridge: float = 0.1,
    max_scale: float = 10.0,
    loss_fn: Callable = per_example_loss,
    shrinks: tuple[float, ...] = SHRINKS,
    progress: bool = False,
    report: dict | None = None,
) -> dict[str, torch.Tensor]:
    """Rescale the kept heads of every layer that lost heads by least squares and fold the scales into the output projections."""
    from tqdm.auto import tqdm

    batches, mask, reference_model, reference = fit_inputs("lsq_recover", model, gates, batches, mask, teacher)
    scales = {g: torch.ones(layers, heads) for g, (layers, heads) in gates.groups.items()}
    fits = []  # (site, reference site, kept positions, their reference positions) of every layer that lost a head and keeps one
    for site in gates.sites:
        ref = reference.site(site.group, site.layer)
        positions = kept_positions(site, mask)
        if positions and len(positions) < len(ref.head_ids):
            fits.append((site, ref, positions, [ref.head_ids.index(site.head_ids[p]) for p in positions]))
    report = {} if report is None else report
    if not fits:
        report.update(shrink=None, fit_loss={}, layers_fitted=0)
        return scales
    steps = len(batches) * (1 + (len(shrinks) if len(shrinks) > 1 else 0))
    with eval_mode(model), tqdm(total=steps, desc="lsq recovery", unit="batch", disable=not progress, leave=False) as bar:
        # (C^T C, C^T y) of every fitted layer, accumulated over the batches from one reference forward each
        sums = [(torch.zeros(len(p), len(p), dtype=torch.float64), torch.zeros(len(p), dtype=torch.float64)) for _, _, p, _ in fits]
        sites = list({id(ref): ref for _, ref, _, _ in fits}.values())
        for batch in batches:
            with reference.masked(None):
                inputs = captured_pass(reference_model, {id(ref): ref.linear("output") for ref in sites}, batch)  # (B, T, width)
            for (site, ref, positions, ref_positions), (gram, rhs) in zip(fits, sums):
                x = valid_rows(ref, batch, inputs[id(ref)])  # (N, width) at the real tokens
                target = F.linear(x, linear_weight(ref.linear("output"))).double()  # (N, hidden): every head
                contributions = head_contributions(x, site.linear("output"), positions, site.head_dim, ref_positions).double()
                gram += torch.einsum("nko,njo->kj", contributions, contributions).cpu()
                rhs += torch.einsum("nko,no->k", contributions, target).cpu()
            bar.update(1)
        deviations = [ridge_solve(gram, rhs, ridge, max_scale) - 1 for gram, rhs in sums]  # (K,) per fitted layer
        originals = [site.linear("output").weight.detach().clone() for site, _, _, _ in fits]
        losses = {}
        for shrink in shrinks if len(shrinks) > 1 else ():
            _fold(fits, originals, deviations, shrink)
            total, count = 0.0, 0  # the mean per-example loss of the model (under ``mask``)
            with gates.masked(mask) if mask is not None else nullcontext():
                for batch in batches:
                    per_example = loss_fn(model(**model_inputs(model, batch)), batch).double()
                    total, count = total + float(per_example.sum()), count + per_example.numel()
                    bar.update(1)
            losses[shrink] = total / max(count, 1)
        best = min(shrinks, key=lambda t: losses.get(t, 0.0))  # the first of equal losses: the most least squares
        _fold(fits, originals, deviations, best)
    for (site, _, positions, _), deviation in zip(fits, deviations):
        scales[site.group][site.layer, [site.head_ids[p] for p in positions]] = (1 + best * deviation).float()
    report.update(shrink=best, fit_loss={f"{t:g}": loss for t, loss in losses.items()}, layers_fitted=len(fits))
    return scales


def _fold(fits: list, originals: list[torch.Tensor], deviations: list[torch.Tensor], shrink: float) -> None:
    """Each fitted layer's output projection set to its original weights with the scales 1 + shrink * (s - 1) folded in."""
    for (site, _, positions, _), original, deviation in zip(fits, originals, deviations):
        output = site.linear("output")
        output.weight.data.copy_(original)
        scale_input_heads(output, positions, site.head_dim, 1 + shrink * deviation)


# ---- FFN neurons ----------------------------------------------------------------------------------


def captured_down_inputs(model: nn.Module, sites: list[FFNSite], batch: dict, stop: bool = False) -> dict[int, torch.Tensor]:
    """{id(site): its down projection's input (gated, as the projection sees it)} in forward order; ``stop`` ends the pass early."""
    return captured_pass(model, {id(site): site.down() for site in sites}, batch, stop=stop)


def valid_rows(site: FFNSite, batch: dict, x: torch.Tensor) -> torch.Tensor:
    """The real (not padding) tokens of a down input x (B, T, W), or (B * T, W) for OPT's flattened tokens, as x's rows (N, W)."""
    valid = group_valid(site.group, batch)
    rows = x.reshape(-1, x.shape[-1])
    if valid is None or valid.numel() != rows.shape[0]:
        return rows
    return rows[valid.to(x.device).reshape(-1).bool()]


def teacher_outputs(teacher: nn.Module, sites: list[FFNSite], batch: dict, stop: bool = False) -> dict[int, torch.Tensor]:
    """{id(site): the teacher block's output without its bias at the real tokens, y (N, hidden)} from one teacher pass."""
    inputs = captured_down_inputs(teacher, sites, batch, stop=stop)
    return {id(site): F.linear(valid_rows(site, batch, inputs[id(site)]), linear_weight(site.down())) for site in sites}


def kept_channels(model: nn.Module, teacher: nn.Module) -> list[int] | None:
    """Positions in the teacher's residual stream of the channels ``model`` still holds (None: the same channels)."""
    from headprune.core.hidden.sites import IDS_ATTR

    mine = getattr(model, IDS_ATTR, None)
    if mine is None:
        return None
    theirs = getattr(teacher, IDS_ATTR, None)
    theirs = theirs["ids"] if theirs is not None else list(range(mine["width_orig"]))
    if mine["ids"] == theirs:
        return None
    position = {channel: p for p, channel in enumerate(theirs)}
    return [position[channel] for channel in mine["ids"]]


def _fit(model, site, teacher, teacher_site, positions, batches, ridge, max_scale, targets, channels=None) -> torch.Tensor:
    """The least-squares scales of one block's kept neurons against the teacher block's output (at ``channels`` of it: kept_channels)."""
    gram = torch.zeros(len(positions), len(positions), dtype=torch.float64)
    rhs = torch.zeros(len(positions), dtype=torch.float64)
    columns = linear_weight(site.down())[:, positions].double()  # (hidden, K)
    column_gram = (columns.t() @ columns).cpu()  # (K, K)
    for index, batch in enumerate(batches):
        x = valid_rows(site, batch, captured_down_inputs(model, [site], batch, stop=True)[id(site)])[:, positions].double()  # (N, K)
        outputs = teacher_outputs(teacher, [teacher_site], batch, stop=True) if targets is None else targets[index]
        target = outputs[id(teacher_site)]
        if channels is not None:  # residual channels were removed: the block's output is fitted where the model still has one
            target = target[:, channels]  # (N, kept hidden)
        # neuron i adds c_i = x[:, i] W_d[:, i]^T: C^T C = (x^T x) * (W_d^T W_d), C^T y = sum_n x_n * (y_n W_d), never (N, K, hidden)
        gram += (x.t() @ x).cpu() * column_gram  # (K, K)
        rhs += (x * (target.double() @ columns)).sum(0).cpu()  # (K,)
    return ridge_solve(gram, rhs, ridge, max_scale)


@torch.no_grad()
def ffn_lsq_recover(
    model: nn.Module,
    gates: Gates,
    batches: Iterable[dict],
    teacher: nn.Module | None = None,
    mask=None,
    ridge: float = 1e-3,
    max_scale: float = 10.0,
    max_cache_bytes: int = 2**30,
) -> dict[str, torch.Tensor]:
    """Rescale the kept neurons of every feed-forward block by least squares, folded into the down projections."""
    batches, mask, teacher, teacher_gates = fit_inputs("ffn_lsq_recover", model, gates, batches, mask, teacher, neurons=True)
    scales = {g: torch.ones(layers, width) for g, (layers, width) in gates.groups.items()}
    with eval_mode(model), gates.masked(mask) if mask is not None else nullcontext():
        forward_order = list(captured_down_inputs(model, gates.sites, batches[0]))
        order = sorted(gates.sites, key=lambda s: forward_order.index(id(s)))
        # per batch {id(teacher site): y} from one teacher forward per batch, or None when it would pass the limit
        first = teacher_outputs(teacher, teacher_gates.sites, batches[0])
        rows = sum(int(y.shape[0]) for y in first.values())  # real tokens of the first batch, summed over the blocks
        cached = rows * max(y.shape[1] for y in first.values()) * len(batches) * 4 <= max_cache_bytes  # ~ every batch's targets
        targets = [first, *(teacher_outputs(teacher, teacher_gates.sites, batch) for batch in batches[1:])] if cached else None
        channels = kept_channels(model, teacher)
        for site in order:
            positions = kept_positions(site, mask)
            if not positions:
                continue
            teacher_site = teacher_gates.site(site.group, site.layer)
            s = _fit(model, site, teacher, teacher_site, positions, batches, ridge, max_scale, targets, channels)
            scale_input_heads(site.down(), positions, 1, s)  # a neuron: one input column, a "head" of width 1
            scales[site.group][site.layer, [site.neuron_ids[p] for p in positions]] = s.float()
    return scales


# ---- any unit -------------------------------------------------------------------------------------

REFITS = {QUERY_HEADS: lsq_recover, FFN: ffn_lsq_recover}  # the fit of each kind whose gates a kind refits


def unit_lsq_recoverer(unit="head+ffn", ridge: float = 1e-3, max_scale: float = 10.0):
    """A ``recover(model, teacher, batches)`` step in any unit: least-squares head scales, then neuron scales on the rescaled attention."""

    def recover(model, teacher, batches):
        batches = list(batches)
        for gates in refit_gates(model, unit):
            REFITS[gates.unit](model, gates, batches, teacher=teacher, ridge=ridge, max_scale=max_scale)

    return recover


def lsq_recoverer(ridge: float = 0.1, max_scale: float = 10.0):
    """A ``recover(model, teacher, batches)`` step (``headprune.selection.schedule.iterative_prune``) for attention heads."""
    return unit_lsq_recoverer("head", ridge, max_scale)


def ffn_lsq_recoverer(ridge: float = 1e-3, max_scale: float = 10.0):
    """A ``recover(model, teacher, batches)`` step (``headprune.selection.schedule.iterative_prune``) for FFN neurons."""
    return unit_lsq_recoverer("ffn", ridge, max_scale)
