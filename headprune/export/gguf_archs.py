"""The llama.cpp architecture each decoder family is written as: one row per architecture, its names from the gguf package."""

from collections.abc import Callable
from dataclasses import dataclass

import torch


def granite_scales(writer, config) -> None:
    """Granite's multipliers as llama.cpp's granite graph reads them (convert_hf_to_gguf's GraniteModel)."""
    writer.add_attention_scale(float(config.attention_multiplier))  # replaces 1 / sqrt(head_dim)
    writer.add_embedding_scale(float(config.embedding_multiplier))
    writer.add_residual_scale(float(config.residual_multiplier))
    writer.add_logit_scale(float(config.logits_scaling))  # llama.cpp divides the logits by it


def gemma_keys(writer, config) -> None:
    """Gemma's soft-capping, sliding window and its layers, and the sliding layers' rotary base (convert_hf_to_gguf's keys)."""
    if getattr(config, "attn_logit_softcapping", None):
        writer.add_attn_logit_softcapping(float(config.attn_logit_softcapping))
    if getattr(config, "final_logit_softcapping", None):
        writer.add_final_logit_softcapping(float(config.final_logit_softcapping))
    writer.add_sliding_window(int(config.sliding_window))
    writer.add_sliding_window_pattern([kind == "sliding_attention" for kind in config.layer_types])
    sliding = (getattr(config, "rope_parameters", None) or {}).get("sliding_attention")
    if sliding:
        writer.add_rope_freq_base_swa(float(sliding["rope_theta"]))


def phi3_unfused(hf_name: str, tensor, heads: int, kv_heads: int):
    """Phi-3's fused projections as Llama's: qkv_proj rows q | k | v, gate_up_proj rows gate | up (HF's chunk order)."""
    if hf_name.endswith("self_attn.qkv_proj.weight"):
        d = tensor.shape[0] // (heads + 2 * kv_heads)
        q, k, v = tensor.split([heads * d, kv_heads * d, kv_heads * d])
        stem = hf_name.removesuffix("qkv_proj.weight")
        return [(f"{stem}q_proj.weight", q), (f"{stem}k_proj.weight", k), (f"{stem}v_proj.weight", v)]
    if hf_name.endswith("mlp.gate_up_proj.weight"):
        gate, up = tensor.chunk(2)
        stem = hf_name.removesuffix("gate_up_proj.weight")
        return [(f"{stem}gate_proj.weight", gate), (f"{stem}up_proj.weight", up)]
    return [(hf_name, tensor)]


def gpt2_tensors(hf_name: str, tensor, heads: int, kv_heads: int):
    """GPT-2's Conv1D weights (in, out) as llama.cpp's (out, in) matrices: c_attn's rows q | k | v, as llama.cpp's attn_qkv."""
    if hf_name.endswith((".attn.bias", ".attn.masked_bias")):
        return []  # the causal mask buffers of older checkpoints
    if hf_name.endswith(("c_attn.weight", "c_proj.weight", "c_fc.weight")):
        return [(hf_name, tensor.t())]
    return [(hf_name, tensor)]


def fused_qkv_tensors(hf_name: str, tensor, heads: int, kv_heads: int):
    """Falcon's query_key_value, per KV head [its query heads | k | v] (GPT-NeoX's: per head [q | k | v], one query head a
    group), as llama.cpp's attn_qkv: all q rows | all k rows | all v rows (convert_hf_to_gguf's FalconModel, GPTNeoXModel)."""
    if ".query_key_value." not in hf_name:
        return [(hf_name, tensor)]
    d = tensor.shape[0] // (heads + 2 * kv_heads)
    groups = tensor.reshape(kv_heads, heads // kv_heads + 2, d, *tensor.shape[1:])  # (KV, group q | k | v, d[, hidden])
    q, k, v = groups[:, :-2].reshape(heads * d, *tensor.shape[1:]), groups[:, -2], groups[:, -1]
    return [(hf_name, torch.cat([q, k.reshape(kv_heads * d, *tensor.shape[1:]), v.reshape(kv_heads * d, *tensor.shape[1:])]))]


def neox_keys(writer, config) -> None:
    """GPT-NeoX's residual layout (attention and FFN side by side, or one after the other)."""
    writer.add_parallel_residual(bool(config.use_parallel_residual))


@dataclass(frozen=True)
class GGUFArch:
    """One llama.cpp architecture: the model types written as it, how its rotary layout and extra metadata are written."""

    name: str  # llama.cpp's architecture name (gguf.MODEL_ARCH_NAMES), the tensor names are gguf.get_tensor_name_map's
    model_types: tuple[str, ...]
    interleaved_rotary: bool  # llama.cpp rotates (2i, 2i+1) pairs (rope type NORM): q/k rows permuted from HF's halves
    per_layer: bool = False  # uneven layouts go to llama.cpp's deci (Llama-like only)
    metadata: Callable | None = None  # (writer, config) -> None: the architecture's own keys
    uneven_instead: str = "export.format=onnx (deci_hf writes Llama and Mistral only)"  # what takes a layout the row cannot hold
    square_attention: bool = False  # llama.cpp reads q and output as hidden x hidden: other widths are written as ``llama``
    unfuse: Callable | None = None  # (HF name, tensor, heads, KV heads) -> [(Llama's HF name, tensor)], written as ``llama``
    norm_offset: float = 0.0  # added to every norm weight: Gemma's norms scale by (1 + w), llama.cpp's by w
    convert: Callable | None = None  # (HF name, tensor, heads, KV heads) -> [(HF name, tensor)] as llama.cpp's architecture reads it
    layer_norm: str | None = None  # LayerNorm with biases: the config field of its epsilon (None: RMS norm)
    rotary: bool = True  # rotary embeddings (gpt2: learned positions)
    square_only: bool = False  # llama.cpp's graph views q | k | v at hidden-size offsets: no query head may be pruned
    always_output: bool = False  # llama.cpp requires the output matrix (gptneox): written even where tied to the embeddings

    @property
    def arch(self):
        """The gguf package's MODEL_ARCH of this row."""
        import gguf

        return next(arch for arch, name in gguf.MODEL_ARCH_NAMES.items() if name == self.name)


def converted(name: str, model_type: str, layer_norm: str, convert: Callable, **more) -> GGUFArch:
    """A row llama.cpp reads in an architecture of its own: tensors converted, LayerNorm, q | k | v at square offsets."""
    return GGUFArch(
        name,
        (model_type,),
        interleaved_rotary=False,
        uneven_instead="export.format=onnx",
        convert=convert,
        layer_norm=layer_norm,
        square_only=True,
        **more,
    )


ARCHS = (
    GGUFArch("llama", ("llama", "mistral"), interleaved_rotary=True, per_layer=True, uneven_instead="the deci architecture"),
    GGUFArch("qwen2", ("qwen2",), interleaved_rotary=False, square_attention=True),  # q/k/v biases
    GGUFArch("qwen3", ("qwen3",), interleaved_rotary=False),
    GGUFArch("granite", ("granite",), interleaved_rotary=True, metadata=granite_scales),
    GGUFArch("phi3", ("phi3",), interleaved_rotary=False, square_attention=True, unfuse=phi3_unfused),  # fused qkv, gate_up
    GGUFArch("gemma2", ("gemma2",), interleaved_rotary=False, metadata=gemma_keys, norm_offset=1.0),
    GGUFArch("gemma3", ("gemma3_text",), interleaved_rotary=False, metadata=gemma_keys, norm_offset=1.0),
    converted("gpt2", "gpt2", "layer_norm_epsilon", gpt2_tensors, rotary=False),  # learned positions
    converted("gptneox", "gpt_neox", "layer_norm_eps", fused_qkv_tensors, always_output=True, metadata=neox_keys),
    converted("falcon", "falcon", "layer_norm_epsilon", fused_qkv_tensors),  # attention and FFN side by side, always
    GGUFArch("olmo2", ("olmo2",), interleaved_rotary=False, uneven_instead="export.format=onnx", always_output=True),
)
BY_MODEL_TYPE = {model_type: row for row in ARCHS for model_type in row.model_types}


LLAMA = ARCHS[0]


def arch_of(model_type: str | None) -> GGUFArch | None:
    """The architecture a model type is written as (None: not written)."""
    return BY_MODEL_TYPE.get(model_type)
