"""A llama or deci GGUF file read back with the ``gguf`` package and run in numpy: its layout and its logits."""

import numpy as np


def _field(reader, key: str):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _per_layer(value, layers: int) -> list[int]:
    return [int(v) for v in value] if isinstance(value, list) else [int(value)] * layers


def read_layout(path: str) -> dict:
    """{"architecture", "head_count", "head_count_kv", "feed_forward_length" (per layer), "tensors": {name: shape}}."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    arch = str(_field(reader, "general.architecture"))
    layers = int(_field(reader, f"{arch}.block_count"))
    return {
        "architecture": arch,
        "head_count": _per_layer(_field(reader, f"{arch}.attention.head_count"), layers),
        "head_count_kv": _per_layer(_field(reader, f"{arch}.attention.head_count_kv"), layers),
        "feed_forward_length": _per_layer(_field(reader, f"{arch}.feed_forward_length"), layers),
        "tensors": {t.name: [int(n) for n in t.data.shape] for t in reader.tensors},
    }


class GGUFDecoder:
    """The decoder of a llama / deci GGUF file as numpy float32 arrays, with a forward pass to logits."""

    def __init__(self, path: str):
        from gguf import GGUFReader

        reader = GGUFReader(path)
        self.layout = read_layout(path)
        arch = self.layout["architecture"]
        self.weights = {t.name: np.asarray(t.data, dtype=np.float32) for t in reader.tensors}
        self.eps = float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon"))
        self.head_dim = int(_field(reader, f"{arch}.attention.key_length"))
        self.theta = float(_field(reader, f"{arch}.rope.freq_base") or 10000.0)
        self.rope_factor = float(_field(reader, f"{arch}.rope.scaling.factor") or 1.0)

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        x64 = x.astype(np.float32)
        return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + self.eps) * self.weights[name]

    def _rotate(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotary embedding on interleaved pairs (2i, 2i+1) of x (B, T, heads, d)."""
        d = self.head_dim
        inv = self.theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
        angle = (positions[:, None] / self.rope_factor) * inv[None]  # (T, d/2)
        cos, sin = np.cos(angle)[None, :, None].astype(np.float32), np.sin(angle)[None, :, None].astype(np.float32)
        even, odd = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = even * cos - odd * sin
        out[..., 1::2] = even * sin + odd * cos
        return out

    def _attention(self, x: np.ndarray, layer: int, keys_valid: np.ndarray) -> np.ndarray:
        """Self-attention of layer ``layer`` on normed x (B, T, hidden); keys_valid (B, T) marks real tokens."""
        heads, kv = self.layout["head_count"][layer], self.layout["head_count_kv"][layer]
        w = {part: self.weights[f"blk.{layer}.attn_{part}.weight"] for part in ("q", "k", "v", "output")}
        batch, length, _ = x.shape
        d, positions = self.head_dim, np.arange(length, dtype=np.float64)
        q = self._rotate((x @ w["q"].T).reshape(batch, length, heads, d), positions)
        k = self._rotate((x @ w["k"].T).reshape(batch, length, kv, d), positions)
        v = (x @ w["v"].T).reshape(batch, length, kv, d)
        group = heads // kv
        k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # query head h reads KV head h // group
        scores = np.einsum("bqhd,bkhd->bhqk", q, k) / np.float32(np.sqrt(d))  # (B, H, T, T)
        allowed = np.tril(np.ones((length, length), dtype=bool))[None, None] & keys_valid[:, None, None, :]
        scores = np.where(allowed, scores, np.float32(-1e30))
        scores = np.exp(scores - scores.max(-1, keepdims=True))
        probs = scores / scores.sum(-1, keepdims=True)
        context = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, heads * d)
        return context @ w["output"].T

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        """Logits (B, T, vocab) of right-padded token ids (B, T); padded keys are masked out."""
        keys_valid = np.ones(input_ids.shape, dtype=bool) if attention_mask is None else attention_mask.astype(bool)
        x = self.weights["token_embd.weight"][input_ids]  # (B, T, hidden)
        for layer in range(len(self.layout["head_count"])):
            attention = None
            if self.layout["head_count"][layer] > 0:
                attention = self._attention(self._norm(x, f"blk.{layer}.attn_norm.weight"), layer, keys_valid)
            if self.layout["feed_forward_length"][layer] == 0:
                continue  # deci: an FFN-free layer leaves the residual stream as it came in
            x = x if attention is None else x + attention
            h = self._norm(x, f"blk.{layer}.ffn_norm.weight")
            gate = h @ self.weights[f"blk.{layer}.ffn_gate.weight"].T
            up = h @ self.weights[f"blk.{layer}.ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ self.weights[f"blk.{layer}.ffn_down.weight"].T
        x = self._norm(x, "output_norm.weight")
        output = self.weights.get("output.weight", self.weights["token_embd.weight"])  # tied: the embeddings
        return x @ output.T
