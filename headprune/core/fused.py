"""Fused q/k/v projections: where each head's rows sit in the one output of the fused layer."""

import torch


def concatenated(heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q (heads * D) | k (kv_heads * D) | v (kv_heads * D): GPT-2's ``c_attn``, Phi-3's ``qkv_proj``."""
    rows = torch.arange((heads + 2 * kv_heads) * head_dim).view(-1, head_dim)  # (H + 2 KV, D)
    return rows[:heads], rows[heads : heads + kv_heads], rows[heads + kv_heads :]


def interleaved(heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per head [q | k | v], head after head (GPT-NeoX's ``query_key_value``, viewed as (heads, 3, D))."""
    if kv_heads != heads:
        raise ValueError(f"an interleaved q/k/v layout has one KV head per query head, got {heads} and {kv_heads}")
    rows = torch.arange(heads * 3 * head_dim).view(heads, 3, head_dim)  # (H, 3, D)
    return rows[:, 0], rows[:, 1], rows[:, 2]


def grouped(heads: int, kv_heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per KV head [its query heads | k | v], group after group (Falcon's ``query_key_value``, viewed as (KV, H / KV + 2, D))."""
    if heads % kv_heads:
        raise ValueError(f"a grouped q/k/v layout needs as many query heads for every KV head, got {heads} over {kv_heads}")
    per_kv = heads // kv_heads
    rows = torch.arange(kv_heads * (per_kv + 2) * head_dim).view(kv_heads, per_kv + 2, head_dim)  # (KV, H / KV + 2, D)
    return rows[:, :per_kv].reshape(heads, head_dim), rows[:, per_kv], rows[:, per_kv + 1]
