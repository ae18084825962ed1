"""Projection layers of either orientation: ``nn.Linear`` (weight [out, in]) and GPT-2's ``Conv1D`` (weight [in, out])."""

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D


def is_projection(module: nn.Module) -> bool:
    """Whether a module is a dense projection (nn.Linear or Conv1D)."""
    return isinstance(module, (nn.Linear, Conv1D))


def in_features(module: nn.Module) -> int:
    """Input width of a projection."""
    return module.nx if isinstance(module, Conv1D) else module.in_features


def out_features(module: nn.Module) -> int:
    """Output width of a projection."""
    return module.nf if isinstance(module, Conv1D) else module.out_features


def linear_weight(module: nn.Module) -> torch.Tensor:
    """The weight as nn.Linear holds it, [out, in] (a transposed view for Conv1D)."""
    return module.weight.t() if isinstance(module, Conv1D) else module.weight


def _take(tensor: torch.Tensor, index: torch.Tensor, dim: int) -> torch.Tensor:
    """``tensor`` indexed along ``dim`` by ``index``, with zeros where the index is -1."""
    index = index.to(tensor.device)
    taken = tensor.index_select(dim, index.clamp(min=0))
    phantom = (index < 0).view([-1 if d == dim else 1 for d in range(tensor.dim())])
    return taken.masked_fill(phantom, 0)


def sliced_projection(module: nn.Module, index: torch.Tensor, outputs: bool) -> nn.Module:
    """A copy of a projection keeping the output (``outputs``) or input units ``index`` (-1: a zero unit)."""
    weight = linear_weight(module).detach()  # (out, in)
    weight = _take(weight, index, 0 if outputs else 1)
    bias = module.bias.detach() if module.bias is not None else None
    if outputs and bias is not None:
        bias = _take(bias, index, 0)
    if isinstance(module, Conv1D):
        new = Conv1D(weight.shape[0], weight.shape[1]).to(device=weight.device, dtype=weight.dtype)
        new.weight = nn.Parameter(weight.t().contiguous(), requires_grad=module.weight.requires_grad)
    else:
        kind = type(module) if type(module).__init__ is nn.Linear.__init__ else nn.Linear  # e.g. FalconLinear
        new = kind(weight.shape[1], weight.shape[0], bias=bias is not None, device=weight.device, dtype=weight.dtype)
        new.weight = nn.Parameter(weight.clone(), requires_grad=module.weight.requires_grad)
    if bias is not None:
        new.bias = nn.Parameter(bias.clone(), requires_grad=module.bias.requires_grad)
    return new


@torch.no_grad()
def scale_input_heads(module: nn.Module, positions: list[int], head_dim: int, scales: torch.Tensor) -> None:
    """Multiply in place the input columns of the heads at ``positions`` by ``scales`` (K,) (an output projection)."""
    factor = scales.to(dtype=module.weight.dtype, device=module.weight.device)
    if isinstance(module, Conv1D):
        rows = module.weight.view(-1, head_dim, module.weight.shape[1])  # (heads, D, hidden): a view of [in, out]
        rows[positions] *= factor.view(-1, 1, 1)
    else:
        cols = module.weight.view(module.weight.shape[0], -1, head_dim)  # (hidden, heads, D): a view of [out, in]
        cols[:, positions] *= factor.view(1, -1, 1)
