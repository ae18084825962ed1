"""A DeciLM (Nemotron-NAS) checkpoint run from its config and weights alone: the forward pass vLLM's nemotron_nas computes,
as the GGUF reader's numpy forward (gguf_numpy.py) over the checkpoint's tensors by their GGUF names."""

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

CONFIG_MODULE = "configuration_decilm.py"


def load_module(path: Path, name: str):
    """The module at ``path``, loaded by path as ``name`` (the checker cannot import headprune), leaving no __pycache__ beside it."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ left in the checkpoint directory
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module


GGUFDecoder = load_module(Path(__file__).with_name("gguf_numpy.py"), "gguf_numpy_reader").GGUFDecoder


def load_config(folder: str):
    """The checkpoint's config through its own configuration module (the class ``auto_map`` names)."""
    folder = Path(folder)
    module = load_module(folder / CONFIG_MODULE, f"decilm_config_{abs(hash(str(folder)))}")
    name = json.loads((folder / "config.json").read_text())["auto_map"]["AutoConfig"].rsplit(".", 1)[1]
    return getattr(module, name).from_pretrained(str(folder))


def layer_layout(config) -> list[dict]:
    """Per layer: query heads, KV heads (0: no attention) and FFN width (0: no FFN), read as vLLM reads block_configs."""
    out = []
    for block in config.block_configs:
        kv = 0 if block.attention.no_op else config.num_attention_heads // block.attention.n_heads_in_group
        if hasattr(block.ffn, "ffn_mult") and not block.ffn.no_op:
            raise ValueError("this reader takes explicit ffn.intermediate_size widths, not ffn_mult")
        width = 0 if block.ffn.no_op else int(block.ffn.intermediate_size)
        out.append({"heads": 0 if block.attention.no_op else int(config.num_attention_heads), "kv_heads": kv, "ffn": width})
    return out


LAYOUT_KEYS = {"head_count": "heads", "head_count_kv": "kv_heads", "feed_forward_length": "ffn"}  # GGUF layout: block entry


class DeciLMReference(GGUFDecoder):
    """The decoder of a DeciLM checkpoint directory in float32, with a forward pass to logits; ``blocks``: its layer_layout."""

    ffn_free_drops_attention = False  # vLLM adds a layer's attention output whether or not an FFN follows

    def __init__(self, folder: str):
        import gguf
        from safetensors.numpy import load_file

        config = load_config(folder)
        self.blocks = layer_layout(config)
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.DECI, len(self.blocks))  # transformers' Llama names -> GGUF's
        weights = {}
        for path in sorted(Path(folder).glob("*.safetensors")):
            weights.update({names.get_name(k, try_suffixes=(".weight",)): v.astype(np.float32) for k, v in load_file(str(path)).items()})
        layout = {"architecture": "deci", **{key: [b[part] for b in self.blocks] for key, part in LAYOUT_KEYS.items()}}
        rope = getattr(config, "rope_parameters", None) or {}
        metadata = {
            "attention.layer_norm_rms_epsilon": config.rms_norm_eps,
            "attention.key_length": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            "rope.freq_base": rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)),
            "rope.scaling.factor": rope.get("factor", 1.0) if rope.get("rope_type") == "linear" else 1.0,
        }
        self._configure(layout, weights, metadata)
        self.halves = True  # transformers' rotary layout: pairs (i, i + d/2), which a GGUF file's permuted q/k rows undo
