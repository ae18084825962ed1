"""A GGUF file of a Llama-like architecture (llama, deci, qwen2, qwen3, granite, phi3, gemma2, gemma3, olmo2) or of gpt2 /
gptneox / falcon read back with the ``gguf`` package and run in numpy: its layout and its logits."""

import numpy as np
from scipy.special import softmax

# llama.cpp's NEOX rope: pairs (i, i + d/2), as HF; the others (2i, 2i+1)
HALVES_ROTARY = ("qwen2", "qwen3", "phi3", "gemma2", "gemma3", "gptneox", "falcon", "olmo2")
GEMMA = ("gemma2", "gemma3")  # embeddings scaled by sqrt(hidden) and a tanh-GELU gate, as llama.cpp's graphs hard-code them
NO_ROTARY = ("gpt2",)  # learned position embeddings (position_embd)
GELU_FFN = ("gpt2", "gptneox", "falcon")  # ffn_down(tanh-GELU(ffn_up(x) + b)) + b: no gate


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1 + np.tanh(np.float32(np.sqrt(2 / np.pi)) * (x + np.float32(0.044715) * x**3)))


def _softcap(x: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(x / cap) (Gemma 2's soft-capping), x itself without a cap."""
    return x if not cap else np.float32(cap) * np.tanh(x / np.float32(cap))


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
    """The decoder of a Llama-like GGUF file as numpy float32 arrays, with a forward pass to logits: optional q/k/v
    biases, per-head q/k norms and post-norms where the file holds them, granite's multipliers, Gemma's soft-capping and
    sliding windows where it names them."""

    ffn_free_drops_attention = True  # llama.cpp's deci: a layer with feed_forward_length 0 ends before its attention is added

    def __init__(self, path: str):
        from gguf import GGUFReader

        reader = GGUFReader(path)
        layout = read_layout(path)
        prefix = f"{layout['architecture']}."
        metadata = {key.removeprefix(prefix): field.contents() for key, field in reader.fields.items() if key.startswith(prefix)}
        self._configure(layout, {t.name: np.asarray(t.data, dtype=np.float32) for t in reader.tensors}, metadata)

    def _configure(self, layout: dict, weights: dict, metadata: dict) -> None:
        """The forward's settings: ``layout`` as read_layout's, float32 tensors by GGUF name, metadata keys after ``<arch>.``."""
        self.layout, self.weights, arch = layout, weights, layout["architecture"]
        self.eps = float(metadata.get("attention.layer_norm_rms_epsilon") or metadata.get("attention.layer_norm_epsilon") or 0.0)
        self.head_dim = int(metadata["attention.key_length"])
        self.rotated = 0 if arch in NO_ROTARY else int(metadata.get("rope.dimension_count") or self.head_dim)
        self.falcon = arch == "falcon"  # x + attn(attn_norm_2 x, or attn_norm x) + ffn(attn_norm x)
        self.parallel = self.falcon or bool(metadata.get("use_parallel_residual"))  # gptneox: x + attn(ln1 x) + ffn(ln2 x)
        self.gelu_ffn = arch in GELU_FFN
        self.theta = float(metadata.get("rope.freq_base") or 10000.0)
        self.rope_factor = float(metadata.get("rope.scaling.factor") or 1.0)
        self.halves = arch in HALVES_ROTARY
        self.attention_scale = float(metadata.get("attention.scale") or 1 / np.sqrt(self.head_dim))
        self.gemma = arch in GEMMA  # embeddings scaled by sqrt(hidden), as llama.cpp's graphs hard-code it
        embedding_scale = np.sqrt(np.float32(int(metadata["embedding_length"]))) if self.gemma else metadata.get("embedding_scale")
        self.embedding_scale = float(embedding_scale or 1.0)
        self.residual_scale = float(metadata.get("residual_scale") or 1.0)
        self.logit_scale = float(metadata.get("logit_scale") or 1.0)
        self.attn_cap = float(metadata.get("attn_logit_softcapping") or 0.0)
        self.final_cap = float(metadata.get("final_logit_softcapping") or 0.0)
        self.window = int(metadata.get("attention.sliding_window") or 0)
        pattern = metadata.get("attention.sliding_window_pattern")
        self.sliding = [bool(v) for v in pattern] if isinstance(pattern, list) else [False] * len(layout["head_count"])
        self.theta_swa = float(metadata.get("rope.freq_base_swa") or self.theta)

    def _norm(self, x: np.ndarray, name: str) -> np.ndarray:
        """RMS norm by the weight ``name``, or LayerNorm where the file holds its bias (gpt2, gptneox); x itself where the
        file holds no such weight (Gemma's post-norms, qwen3's and olmo2's q/k norms; olmo2 norms no block input)."""
        if name not in self.weights:
            return x
        x64 = x.astype(np.float32)
        bias = self.weights.get(name.removesuffix(".weight") + ".bias")
        if bias is None:
            return x64 / np.sqrt((x64 * x64).mean(-1, keepdims=True) + self.eps) * self.weights[name]
        centred = x64 - x64.mean(-1, keepdims=True)
        return centred / np.sqrt((centred * centred).mean(-1, keepdims=True) + self.eps) * self.weights[name] + bias

    def _rotate(self, x: np.ndarray, positions: np.ndarray, sliding: bool = False) -> np.ndarray:
        """Rotary embedding of the first ``rotated`` dims of x (B, T, heads, d) on pairs (2i, 2i+1), or (i, i + d/2) for the
        halves layout; a sliding layer rotates by its own base, unscaled (gemma3); the other dims pass (partial rotary)."""
        d = self.rotated
        if d == 0:
            return x
        theta, factor = (self.theta_swa, 1.0) if sliding else (self.theta, self.rope_factor)
        inv = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)  # (d/2,)
        angle = (positions[:, None] / factor) * inv[None]  # (T, d/2)
        cos, sin = np.cos(angle)[None, :, None].astype(np.float32), np.sin(angle)[None, :, None].astype(np.float32)
        first, second = (slice(0, d // 2), slice(d // 2, d)) if self.halves else (slice(0, d, 2), slice(1, d, 2))
        out = x.copy()
        out[..., first] = x[..., first] * cos - x[..., second] * sin
        out[..., second] = x[..., first] * sin + x[..., second] * cos
        return out

    def _project(self, x: np.ndarray, layer: int, part: str) -> np.ndarray:
        """x @ W.T (+ the file's bias) of ``blk.<layer>.attn_<part>``, or its rows of a fused ``attn_qkv`` (phi3: q | k | v)."""
        fused = self.weights.get(f"blk.{layer}.attn_qkv.weight")
        if fused is not None:
            q, kv = (self.layout[key][layer] * self.head_dim for key in ("head_count", "head_count_kv"))
            start, stop = {"q": (0, q), "k": (q, q + kv), "v": (q + kv, q + 2 * kv)}[part]
            bias = self.weights.get(f"blk.{layer}.attn_qkv.bias")
            return x @ fused[start:stop].T + (0 if bias is None else bias[start:stop])
        return self._linear(x, f"blk.{layer}.attn_{part}")

    def _head_norm(self, x: np.ndarray, layer: int, part: str) -> np.ndarray:
        """RMS norm of q or k (B, T, heads, d) where the file holds ``attn_<part>_norm``: per head (qwen3) or over all heads (olmo2)."""
        name = f"blk.{layer}.attn_{part}_norm.weight"
        if name not in self.weights or self.weights[name].size == x.shape[-1]:
            return self._norm(x, name)
        return self._norm(x.reshape(*x.shape[:2], -1), name).reshape(x.shape)

    def _attention(self, x: np.ndarray, layer: int, keys_valid: np.ndarray) -> np.ndarray:
        """Self-attention of layer ``layer`` on normed x (B, T, hidden); keys_valid (B, T) marks real tokens."""
        heads, kv = self.layout["head_count"][layer], self.layout["head_count_kv"][layer]
        batch, length, _ = x.shape
        d, positions, sliding = self.head_dim, np.arange(length, dtype=np.float64), self.sliding[layer]
        q = self._rotate(self._head_norm(self._project(x, layer, "q").reshape(batch, length, heads, d), layer, "q"), positions, sliding)
        k = self._rotate(self._head_norm(self._project(x, layer, "k").reshape(batch, length, kv, d), layer, "k"), positions, sliding)
        v = self._project(x, layer, "v").reshape(batch, length, kv, d)
        group = heads // kv
        k, v = np.repeat(k, group, axis=2), np.repeat(v, group, axis=2)  # query head h reads KV head h // group
        scores = _softcap(np.einsum("bqhd,bkhd->bhqk", q, k) * np.float32(self.attention_scale), self.attn_cap)  # (B, H, T, T)
        causal = np.tril(np.ones((length, length), dtype=bool))
        if sliding and self.window:  # query t sees keys t - window + 1 .. t
            causal &= ~np.tril(np.ones((length, length), dtype=bool), -self.window)
        allowed = causal[None, None] & keys_valid[:, None, None, :]
        probs = softmax(np.where(allowed, scores, np.float32(-1e30)), axis=-1)
        context = np.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, length, heads * d)
        out = self._linear(context, f"blk.{layer}.attn_output")
        return self._norm(out, f"blk.{layer}.post_attention_norm.weight")

    def _linear(self, x: np.ndarray, name: str) -> np.ndarray:
        """x @ W.T of the tensor ``<name>.weight``, plus ``<name>.bias`` where the file holds one."""
        bias = self.weights.get(f"{name}.bias")
        out = x @ self.weights[f"{name}.weight"].T
        return out if bias is None else out + bias

    def _ffn(self, h: np.ndarray, layer: int) -> np.ndarray:
        """The FFN of normed h: down(tanh-GELU(up h + b)) + b without a gate (gpt2, gptneox, falcon), else down(act(gate h) * up h), SiLU or (Gemma) tanh-GELU, phi3's ffn_up holding gate | up."""
        up = self._linear(h, f"blk.{layer}.ffn_up")
        if self.gelu_ffn:
            return self._linear(_gelu_tanh(up), f"blk.{layer}.ffn_down")
        gate = self.weights.get(f"blk.{layer}.ffn_gate.weight")
        gate, up = (h @ gate.T, up) if gate is not None else np.split(up, 2, axis=-1)
        active = _gelu_tanh(gate) if self.gemma else gate / (1 + np.exp(-gate))
        return self._linear(active * up, f"blk.{layer}.ffn_down")

    def logits(self, input_ids: np.ndarray, attention_mask: np.ndarray | None = None) -> np.ndarray:
        """Logits (B, T, vocab) of right-padded token ids (B, T); padded keys are masked out."""
        keys_valid = np.ones(input_ids.shape, dtype=bool) if attention_mask is None else attention_mask.astype(bool)
        x = self.weights["token_embd.weight"][input_ids] * np.float32(self.embedding_scale)  # (B, T, hidden)
        if "position_embd.weight" in self.weights:  # gpt2: learned positions 0 .. T-1
            x = x + self.weights["position_embd.weight"][: input_ids.shape[1]]
        scale = np.float32(self.residual_scale)  # granite: each block's output scaled before it joins the residual stream
        for layer in range(len(self.layout["head_count"])):
            attention = None
            if self.layout["head_count"][layer] > 0:
                second = f"blk.{layer}.attn_norm_2.weight"  # falcon: attention and FFN read two norms side by side
                norm = second if second in self.weights else f"blk.{layer}.attn_norm.weight"
                attention = self._attention(self._norm(x, norm), layer, keys_valid)
            ffn_free = self.layout["feed_forward_length"][layer] == 0
            if ffn_free and self.ffn_free_drops_attention:
                continue  # deci: an FFN-free layer leaves the residual stream as it came in
            stream = x if attention is None else x + attention * scale
            if not ffn_free:  # parallel residual (gptneox, falcon): the FFN reads the stream the layer received
                h = self._norm(x if self.parallel else stream, f"blk.{layer}.{'attn_norm' if self.falcon else 'ffn_norm'}.weight")
                stream = stream + self._norm(self._ffn(h, layer), f"blk.{layer}.post_ffw_norm.weight") * scale
            x = stream
        x = self._norm(x, "output_norm.weight")
        output = self.weights.get("output.weight", self.weights["token_embd.weight"])  # tied: the embeddings
        return _softcap(x @ output.T / np.float32(self.logit_scale), self.final_cap)
