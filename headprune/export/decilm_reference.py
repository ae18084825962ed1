"""A DeciLM (Nemotron-NAS) checkpoint run from its config and weights alone: the forward pass vLLM's nemotron_nas computes."""

import importlib.util
import json
import sys
from pathlib import Path

import torch

CONFIG_MODULE = "configuration_decilm.py"


def load_config(folder: str):
    """The checkpoint's config through its own configuration module (the class ``auto_map`` names)."""
    folder = Path(folder)
    spec = importlib.util.spec_from_file_location(f"decilm_config_{abs(hash(str(folder)))}", folder / CONFIG_MODULE)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ left in the checkpoint directory
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    name = json.loads((folder / "config.json").read_text())["auto_map"]["AutoConfig"].rsplit(".", 1)[1]
    return getattr(module, name).from_pretrained(str(folder))


def layer_layout(config) -> list[dict]:
    """Per layer: query heads, KV heads (0: no attention) and FFN width (0: no FFN), read as vLLM reads block_configs."""
    out = []
    for block in config.block_configs:
        kv = 0 if block.attention.no_op else config.num_attention_heads // block.attention.n_heads_in_group
        if block.ffn.no_op:
            width = 0
        elif hasattr(block.ffn, "ffn_mult"):
            raise ValueError("this reader takes explicit ffn.intermediate_size widths, not ffn_mult")
        else:
            width = int(block.ffn.intermediate_size)
        out.append({"heads": 0 if block.attention.no_op else int(config.num_attention_heads), "kv_heads": kv, "ffn": width})
    return out


class DeciLMReference:
    """The decoder of a DeciLM checkpoint directory in float32, with a forward pass to logits."""

    def __init__(self, folder: str):
        from safetensors.torch import load_file

        self.config = config = load_config(folder)
        self.layout = layer_layout(config)
        self.weights = {}
        for path in sorted(Path(folder).glob("*.safetensors")):
            self.weights.update({k: v.float() for k, v in load_file(str(path)).items()})
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        rope = getattr(config, "rope_parameters", None) or {}
        self.theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        self.rope_factor = float(rope.get("factor", 1.0)) if rope.get("rope_type") == "linear" else 1.0
        self.eps = float(config.rms_norm_eps)

    def _norm(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weights[name]

    def _rotate(self, x: torch.Tensor) -> torch.Tensor:
        """Rotary embedding on the halves of each head of x (B, heads, T, d)."""
        d, length = self.head_dim, x.shape[2]
        inv = 1.0 / self.theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)  # (d/2,)
        angle = torch.outer(torch.arange(length, dtype=torch.float32) / self.rope_factor, inv)  # (T, d/2)
        cos, sin = torch.cat([angle.cos()] * 2, -1), torch.cat([angle.sin()] * 2, -1)  # (T, d)
        half = torch.cat([-x[..., d // 2 :], x[..., : d // 2]], -1)
        return x * cos + half * sin

    def _attention(self, x: torch.Tensor, layer: int, keys_valid: torch.Tensor) -> torch.Tensor:
        """Self-attention of layer ``layer`` on normed x (B, T, hidden); keys_valid (B, T) marks real tokens."""
        shape, prefix, d = self.layout[layer], f"model.layers.{layer}.self_attn.", self.head_dim
        batch, length, _ = x.shape
        split = lambda t, n: t.view(batch, length, n, d).transpose(1, 2)  # noqa: E731  (B, n, T, d)
        q = self._rotate(split(x @ self.weights[prefix + "q_proj.weight"].T, shape["heads"]))
        k = self._rotate(split(x @ self.weights[prefix + "k_proj.weight"].T, shape["kv_heads"]))
        v = split(x @ self.weights[prefix + "v_proj.weight"].T, shape["kv_heads"])
        group = shape["heads"] // shape["kv_heads"]
        k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)  # query head h reads KV head h // group
        scores = q @ k.transpose(-1, -2) / d**0.5  # (B, H, T, T)
        allowed = torch.ones(length, length, dtype=torch.bool).tril()[None, None] & keys_valid[:, None, None, :]
        probs = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        context = (probs @ v).transpose(1, 2).reshape(batch, length, shape["heads"] * d)
        return context @ self.weights[prefix + "o_proj.weight"].T

    def _ffn(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        prefix = f"model.layers.{layer}.mlp."
        gate, up = x @ self.weights[prefix + "gate_proj.weight"].T, x @ self.weights[prefix + "up_proj.weight"].T
        return (torch.nn.functional.silu(gate) * up) @ self.weights[prefix + "down_proj.weight"].T

    @torch.no_grad()
    def logits(self, input_ids, attention_mask=None):
        """Logits (B, T, vocab) as numpy of right-padded token ids (B, T) (numpy or torch); padded keys are masked out."""
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        keys_valid = torch.ones_like(ids, dtype=torch.bool) if attention_mask is None else torch.as_tensor(attention_mask).bool()
        x = self.weights["model.embed_tokens.weight"][ids]  # (B, T, hidden)
        for layer, shape in enumerate(self.layout):
            if shape["kv_heads"]:
                x = x + self._attention(self._norm(x, f"model.layers.{layer}.input_layernorm.weight"), layer, keys_valid)
            if shape["ffn"]:
                x = x + self._ffn(self._norm(x, f"model.layers.{layer}.post_attention_layernorm.weight"), layer)
        x = self._norm(x, "model.norm.weight")
        output = self.weights.get("lm_head.weight", self.weights["model.embed_tokens.weight"])  # tied: the embeddings
        return (x @ output.T).numpy()
