"""Weights that transformers v4 and v5 rebuild bit-for-bit: each a pure function of (seed, name, shape)."""

from __future__ import annotations

import hashlib
import zlib

import torch

_MASK32 = 0xFFFFFFFF


def _mix(values: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash (murmur3's finaliser) in int64, exact on every platform."""
    values = values & _MASK32
    values = ((values ^ (values >> 16)) * 0x85EBCA6B) & _MASK32
    values = ((values ^ (values >> 13)) * 0xC2B2AE35) & _MASK32
    return values ^ (values >> 16)


def fixture_tensor(seed: int, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """Uniform values in [-scale, scale) of float32, from integer hashing only (no random generator)."""
    numel = 1
    for size in shape:
        numel *= size
    key = zlib.crc32(f"{seed}:{name}".encode())
    index = torch.arange(numel, dtype=torch.int64)
    bits = _mix(_mix(index * 0x9E3779B1 + key) + key)  # 32 bits per element
    unit = (bits >> 8).to(torch.float64) / float(1 << 24) * 2.0 - 1.0  # [-1, 1), 24 bits: exact in float32
    if "norm" in name.lower() or "ln_" in name:
        values = 1.0 + 0.1 * unit if name.endswith("weight") else 0.1 * unit  # norms near the identity
    elif len(shape) >= 2:
        values = unit * (3.0 / shape[-1]) ** 0.5  # unit variance per output over the last dimension's fan
    else:
        values = 0.1 * unit
    return values.to(torch.float32).reshape(shape)


def fill_parameters(model: torch.nn.Module, seed: int, names: dict[str, str] | None = None) -> list[str]:
    """Overwrite every parameter by fixture_tensor of its (mapped) name; returns the names used, in order."""
    names = names or {}
    used = []
    with torch.no_grad():
        for own_name, parameter in model.named_parameters():  # a tied weight once, by its first name
            name = names.get(own_name, own_name)
            parameter.copy_(fixture_tensor(seed, name, tuple(parameter.shape)))
            used.append(name)
    return used


def weights_digest(named: dict[str, torch.Tensor]) -> str:
    """SHA-256 over the (name, float32 bytes) of every tensor in name order: equal digests, equal weights."""
    digest = hashlib.sha256()
    for name in sorted(named):
        digest.update(name.encode())
        digest.update(named[name].detach().to(torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()
