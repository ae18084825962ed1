"""The bandwidth-ideal of a decode gain: the bytes one generated token reads, unpruned over pruned.

Decoding one token reads every weight matrix once (a tied embedding in full, as the output projection; an untied one
a single row) and the KV cache of the context so far. On a CPU that streams its weights from memory the generation
speed-up cannot exceed (bytes read by the reference) / (bytes read by the pruned file) - 1 by much: a measured gain
above it is a measurement to explain (kernels, graph, order, a busy machine) before it is a result.

The bytes come from a GGUF file's own tensors (``gguf_bytes``, the ``gguf`` package), or, where the file is not at
hand, from the widths a mask keeps in a llama-shaped model (``layer_widths``, ``file_bytes``), with llama.cpp's
storage: 1-D tensors f32, matrices f16 or Q8_0 (34 bytes per 32 values; a matrix whose rows are not a multiple of 32
stays f16).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headprune.engine.verdict import beyond_ideal  # noqa: E402

Q8_BLOCK, Q8_BLOCK_BYTES = 32, 34  # Q8_0: 32 int8 values and one f16 scale


@dataclass(frozen=True)
class LlamaShape:
    """A llama-architecture decoder: widths of the unpruned model."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    tied: bool


SMOLLM2_135M = LlamaShape(hidden=576, layers=30, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152, tied=True)


def layer_widths(mask: dict | None, shape: LlamaShape = SMOLLM2_135M) -> list[tuple[int, int]]:
    """Per layer (KV groups kept, FFN neurons kept) of a headprune mask (``dec_self`` per KV group, ``dec_ffn`` per neuron)."""
    mask = mask or {}
    kv = mask.get("dec_self", [[1] * shape.kv_heads] * shape.layers)
    ffn = mask.get("dec_ffn", [[1] * shape.ffn] * shape.layers)
    if len(kv) != shape.layers or any(len(row) != shape.kv_heads for row in kv):
        raise ValueError(f"dec_self must hold {shape.layers} layers x {shape.kv_heads} KV groups (a kv_group mask)")
    return [(sum(1 for v in k if v >= 0.5), sum(1 for v in f if v >= 0.5)) for k, f in zip(kv, ffn)]


def tensor_shapes(widths: list[tuple[int, int]], shape: LlamaShape = SMOLLM2_135M) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, (ne0, ne1)) of every tensor of the pruned model: ne0 is a matrix's row length (its input width)."""
    d, group = shape.hidden, shape.heads // shape.kv_heads
    out: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (d, shape.vocab)), ("output_norm.weight", (d,))]
    if not shape.tied:
        out.append(("output.weight", (d, shape.vocab)))
    for i, (kv, ffn) in enumerate(widths):
        q, k = kv * group * shape.head_dim, kv * shape.head_dim
        layer = [("attn_norm", (d,)), ("attn_q", (d, q)), ("attn_k", (d, k)), ("attn_v", (d, k)), ("attn_output", (q, d))]
        layer += [("ffn_norm", (d,)), ("ffn_gate", (d, ffn)), ("ffn_up", (d, ffn)), ("ffn_down", (ffn, d))]
        out += [(f"blk.{i}.{name}.weight", dims) for name, dims in layer if all(dims)]  # an emptied part has no tensor
    return out


def tensor_bytes(dims: tuple[int, ...], fmt: str) -> int:
    """Bytes of one tensor in a llama.cpp file of ``fmt`` (f32, f16 or q8_0)."""
    n = 1
    for v in dims:
        n *= v
    if len(dims) == 1 or fmt == "f32":
        return 4 * n
    if fmt == "q8_0" and dims[0] % Q8_BLOCK == 0:
        return n // Q8_BLOCK * Q8_BLOCK_BYTES
    if fmt in ("f16", "q8_0"):
        return 2 * n
    raise ValueError(f"unknown file format {fmt!r}: f32, f16 or q8_0")


def read_per_token(sizes: dict[str, tuple[int, int]]) -> int:
    """Bytes one decoded token reads of tensors {name: (elements, bytes)}: all of them, an untied embedding one row."""
    total = sum(b for _, b in sizes.values())
    if "output.weight" in sizes and "token_embd.weight" in sizes:
        elements, stored = sizes["token_embd.weight"]
        rows = elements // sizes["output_norm.weight"][0] if "output_norm.weight" in sizes else 1
        total -= stored - stored // max(rows, 1)
    return total


def file_bytes(widths: list[tuple[int, int]], fmt: str, shape: LlamaShape = SMOLLM2_135M) -> dict:
    """{"weights", "bytes", "read_per_token"} of the pruned model written as a ``fmt`` GGUF (tensors only)."""
    sizes = {}
    for name, dims in tensor_shapes(widths, shape):
        n = 1
        for v in dims:
            n *= v
        sizes[name] = (n, tensor_bytes(dims, fmt))
    return summary(sizes)


def gguf_bytes(path) -> dict:
    """{"weights", "bytes", "read_per_token"} read from a GGUF file's tensors."""
    from gguf import GGUFReader

    return summary({t.name: (int(t.n_elements), int(t.n_bytes)) for t in GGUFReader(str(path)).tensors})


def summary(sizes: dict[str, tuple[int, int]]) -> dict:
    return {
        "weights": sum(n for n, _ in sizes.values()),
        "bytes": sum(b for _, b in sizes.values()),
        "read_per_token": read_per_token(sizes),
    }


def kv_bytes_per_token(widths: list[tuple[int, int]], cache_bytes: int = 2, shape: LlamaShape = SMOLLM2_135M) -> int:
    """KV cache bytes per token of context (K and V of every kept KV group, ``cache_bytes`` per value: f16 = 2)."""
    return sum(2 * kv * shape.head_dim * cache_bytes for kv, _ in widths)


def decode_context(prompt: int, gen: int) -> float:
    """The mean context a generated token attends to when ``gen`` tokens follow ``prompt`` tokens (one at a time)."""
    return prompt + (gen - 1) / 2


def decode_ideal(reference: dict, pruned: dict, context: float) -> float:
    """The bandwidth-ideal decode gain: (weights + KV at ``context`` read per token) of the reference over the pruned, - 1.

    ``reference`` / ``pruned``: {"read_per_token" (weight bytes), "kv_per_token" (cache bytes per token of context)}."""
    ref = reference["read_per_token"] + reference["kv_per_token"] * context
    new = pruned["read_per_token"] + pruned["kv_per_token"] * context
    return ref / new - 1


def ideal_text(gain: dict, ideal: float) -> str:
    """``ideal +7.5%``, with ``above: to be re-measured`` where the measured gain exceeds it beyond its interval."""
    return f"ideal {100 * ideal:+.1f}%" + ("; above it: to be re-measured" if beyond_ideal(gain, ideal) else "")
