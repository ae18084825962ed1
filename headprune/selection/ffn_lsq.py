"""Retraining-free recovery of FFN neurons: least-squares neuron scales per block (Kwon et al. 2022, mask tuning)."""

import copy
from collections.abc import Iterable
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from transformers.pytorch_utils import Conv1D

from headprune.core.ffn.pruning import ffn_record
from headprune.core.ffn.sites import FFNSite
from headprune.core.inputs import eval_mode, group_valid
from headprune.core.kinds.gates_protocol import Gates
from headprune.core.projections import linear_weight
from headprune.core.units import unit_gates
from headprune.selection.captures import captured_module_inputs
from headprune.selection.lsq import fit_inputs, kept_positions, need_no_teacher, ridge_solve


def captured_down_inputs(model: nn.Module, sites: list[FFNSite], batch: dict, stop: bool = False) -> dict[int, torch.Tensor]:
    """{id(site): its down projection's input (gated, as the projection sees it)} in forward order; ``stop`` ends the pass early."""
    return captured_module_inputs(model, {id(site): site.down() for site in sites}, batch, stop)


def valid_rows(site: FFNSite, batch: dict, x: torch.Tensor) -> torch.Tensor:
    """The real (not padding) tokens of a down input x (B, T, W), or (B * T, W) for OPT's flattened tokens, as x's rows (N, W)."""
    valid = group_valid(site.group, batch)
    rows = x.reshape(-1, x.shape[-1])
    if valid is None or valid.numel() != rows.shape[0]:
        return rows
    return rows[valid.to(x.device).reshape(-1).bool()]


@torch.no_grad()
def scale_down_columns(down: nn.Module, positions: list[int], scales: torch.Tensor) -> None:
    """Multiply in place the down projection's input columns at ``positions`` by ``scales`` (K,)."""
    factor = scales.to(dtype=down.weight.dtype, device=down.weight.device)
    index = torch.tensor(positions, device=down.weight.device)
    if isinstance(down, Conv1D):  # weight [in, out]: a neuron is a row
        down.weight[index] *= factor.view(-1, 1)
    else:
        down.weight[:, index] *= factor.view(1, -1)


def _teacher_sites(model: nn.Module, gates: Gates, teacher: nn.Module | None) -> tuple[nn.Module, Gates]:
    """The unpruned reference model and its FFN gates, ungated (a copy of ``model`` when it has no neuron removed yet)."""
    if teacher is None:
        need_no_teacher(bool(ffn_record(model)), "FFN neurons", "block")
        teacher = copy.deepcopy(model)
    reference = unit_gates(teacher, gates.unit)  # the same kind's gates on the teacher
    reference.set_mask(None)
    return teacher.eval(), reference


def _target(teacher_site: FFNSite, batch: dict, x: torch.Tensor) -> torch.Tensor:
    """The teacher block's output without its bias at the real tokens, y (N, hidden)."""
    return F.linear(valid_rows(teacher_site, batch, x), linear_weight(teacher_site.down()))


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
        if targets is None:
            teacher_x = captured_down_inputs(teacher, [teacher_site], batch, stop=True)[id(teacher_site)]
            target = _target(teacher_site, batch, teacher_x)
        else:
            target = targets[id(teacher_site), index]
        if channels is not None:  # residual channels were removed: the block's output is fitted where the model still has one
            target = target[:, channels]  # (N, kept hidden)
        # neuron i adds c_i = x[:, i] W_d[:, i]^T: C^T C = (x^T x) * (W_d^T W_d), C^T y = sum_n x_n * (y_n W_d), never (N, K, hidden)
        gram += (x.t() @ x).cpu() * column_gram  # (K, K)
        rhs += (x * (target.double() @ columns)).sum(0).cpu()  # (K,)
    return ridge_solve(gram, rhs, ridge, max_scale)


def _teacher_targets(teacher, gates: Gates, batches: list[dict], max_cache_bytes: int) -> dict | None:
    """{(id(teacher site), batch index): y} from one teacher forward per batch, or None when it would pass the limit."""
    tokens = sum(max(int(v.numel()) for v in b.values() if torch.is_tensor(v) and v.dim() == 2) for b in batches)  # a bound
    hidden = max(linear_weight(site.down()).shape[0] for site in gates.sites)
    if tokens * hidden * len(gates.sites) * 4 > max_cache_bytes:
        return None
    targets = {}
    for index, batch in enumerate(batches):
        inputs = captured_down_inputs(teacher, gates.sites, batch)
        for site in gates.sites:
            targets[id(site), index] = _target(site, batch, inputs[id(site)])
    return targets


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
    batches, mask = fit_inputs("ffn_lsq_recover", gates, batches, mask)
    teacher, teacher_gates = _teacher_sites(model, gates, teacher)
    scales = {g: torch.ones(layers, width) for g, (layers, width) in gates.groups.items()}
    with eval_mode(model), gates.masked(mask) if mask is not None else nullcontext():
        forward_order = list(captured_down_inputs(model, gates.sites, batches[0]))
        order = sorted(gates.sites, key=lambda s: forward_order.index(id(s)))
        targets = _teacher_targets(teacher, teacher_gates, batches, max_cache_bytes)
        channels = kept_channels(model, teacher)
        for site in order:
            positions = kept_positions(site, mask)
            if not positions:
                continue
            teacher_site = teacher_gates.site(site.group, site.layer)
            s = _fit(model, site, teacher, teacher_site, positions, batches, ridge, max_scale, targets, channels)
            scale_down_columns(site.down(), positions, s)
            scales[site.group][site.layer, [site.neuron_ids[p] for p in positions]] = s.float()
    return scales
