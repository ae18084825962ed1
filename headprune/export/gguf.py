"""GGUF files of uniformly pruned decoders in llama.cpp's conventions (one architecture per family: gguf_archs.py)."""

import re
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from headprune.core.checks import ConfigError
from headprune.export.gguf_archs import ARCHS, LLAMA, GGUFArch, arch_of
from headprune.export.hf import rope_and_bias_refusal, stock_ffn_width, stock_shape

GGUF_TYPES = tuple(model_type for row in ARCHS for model_type in row.model_types)
DTYPES = ("f32", "f16")


def permute_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """q/k rows from HF's rotary layout (each head: first half, second half) to llama.cpp's (interleaved pairs)."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def refusal(fields: dict) -> str | None:
    """Why a model of these config fields cannot be written as GGUF (None when it can): the families and settings it takes."""
    model_type = fields.get("model_type")
    if model_type not in GGUF_TYPES:
        return (
            f"export.format=gguf writes the decoders {', '.join(GGUF_TYPES)} (each as its llama.cpp architecture; uneven "
            f"Llama or Mistral layers as deci), not {model_type!r}: the writer maps the tensor names, rotary layout and "
            "tokenizer of these families only; use export.format=onnx"
        )
    if arch_of(model_type).layer_norm:
        return layer_norm_refusal(fields)
    if fields.get("use_sliding_window"):
        return (
            f"export.format=gguf: llama.cpp's {arch_of(model_type).name} architecture has no sliding window: use export.format=hf or onnx"
        )
    if model_type == "phi3" and fields.get("sliding_window"):  # a pruned one is written as llama.cpp's llama, which has none
        return "export.format=gguf writes phi3 without a sliding window, this model has one: use export.format=hf or onnx"
    if arch_of(model_type).norm_offset and (why := gemma_refusal(fields)):
        return why
    rope = fields.get("rope_parameters") or {}
    if float(rope.get("partial_rotary_factor") or fields.get("partial_rotary_factor") or 1.0) != 1.0:
        return (
            f"export.format=gguf writes {model_type} with rotary embeddings over the whole head (partial_rotary_factor 1): "
            "use export.format=hf or onnx"
        )
    return rope_and_bias_refusal(fields, "gguf", "export.format=hf or onnx")


GELU_TANH = ("gelu_new", "gelu_pytorch_tanh", "gelu_fast")  # what llama.cpp's gpt2 / gptneox graphs compute (ggml_gelu)
GELU_ERF = ("gelu",)  # exact GELU: written as llama.cpp runs every GPT-NeoX (tanh), within 5e-4 of it per neuron
ACTIVATION_FIELDS = {"gpt2": ("activation_function", "gelu_new"), "gpt_neox": ("hidden_act", "gelu"), "falcon": ("activation", "gelu")}


def layer_norm_refusal(fields: dict) -> str | None:
    """Why a GPT-2, GPT-NeoX or Falcon config differs from what llama.cpp's gpt2 / gptneox / falcon graphs compute (None when
    it does not); Falcon's: rotary positions, attention and FFN side by side, no biases, a GELU FFN."""
    model_type = fields.get("model_type")
    gpt2, neox, falcon = (model_type == name for name in ("gpt2", "gpt_neox", "falcon"))
    key, default = ACTIVATION_FIELDS[model_type]  # the family's config field and its default
    activation = fields.get(key) or default
    rope = fields.get("rope_parameters") or fields.get("rope_scaling") or {}
    found = None
    if falcon and fields.get("alibi"):
        found = "ALiBi positions (alibi true), where llama.cpp's falcon rotates q and k"
    elif falcon and fields.get("parallel_attn") is False:
        found = "attention and FFN one after the other (parallel_attn false), where llama.cpp's falcon runs them side by side"
    elif falcon and fields.get("bias"):
        found = "biases on query_key_value, dense and the FFN (bias true), which llama.cpp's falcon does not read"
    elif activation not in GELU_TANH + (() if gpt2 else GELU_ERF):
        found = f"the activation {activation}, not GELU"
    elif gpt2 and fields.get("scale_attn_by_inverse_layer_idx"):
        found = "attention scaled by the inverse layer index (scale_attn_by_inverse_layer_idx)"
    elif gpt2 and fields.get("scale_attn_weights") is False:
        found = "unscaled attention scores (scale_attn_weights false)"
    elif neox and fields.get("attention_bias") is False:
        found = "no query_key_value or dense biases (llama.cpp's gptneox reads them)"
    elif not gpt2 and rope.get("rope_type", rope.get("type", "default")) != "default":
        found = f"rotary scaling {rope}"
    return differs(fields, found, "export.format=onnx")


def differs(fields: dict, found: str | None, instead: str) -> str | None:
    """Why the model (``found``: what it has that llama.cpp's graph does not compute) cannot be written; None when nothing is found."""
    if found is None:
        return None
    model_type = fields.get("model_type")
    return f"export.format=gguf writes {model_type} as llama.cpp's {arch_of(model_type).name}, and this model has {found}: use {instead}"


def square_message(model_type: str, found: str) -> str:
    """Why pruned query heads (``found``, after "the hidden size") cannot go into an architecture reading square attention."""
    return (
        f"export.format=gguf writes {model_type} as llama.cpp's {arch_of(model_type).name}, whose graph reads q, k and v as "
        f"blocks of the hidden size{found}: prune FFN neurons or layers only (no heads), or use export.format=onnx"
    )


def gemma_refusal(fields: dict) -> str | None:
    """Why a Gemma config differs from what llama.cpp's gemma2 / gemma3 graphs hard-code (None when it does not)."""
    name = arch_of(fields.get("model_type")).name
    pattern = 2 if name == "gemma2" else 6  # llama.cpp: every 2nd (gemma2) / 6th (gemma3) layer global, the others sliding
    layers = int(fields.get("num_hidden_layers") or 0)
    expected = ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers)]
    head_dim = fields.get("head_dim") or int(fields["hidden_size"]) // int(fields["num_attention_heads"])
    found = None
    if fields.get("query_pre_attn_scalar") not in (None, head_dim):
        found = f"query_pre_attn_scalar {fields['query_pre_attn_scalar']}, not the head size {head_dim} llama.cpp scales by"
    elif fields.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
        found = f"hidden_activation {fields['hidden_activation']}, not gelu_pytorch_tanh"
    elif fields.get("layer_types") and list(fields["layer_types"]) != expected:
        found = f"layer_types {list(fields['layer_types'])}, not llama.cpp's every {pattern} layers one global ({expected})"
    elif name == "gemma2" and fields.get("tie_word_embeddings") is False:
        found = "an output projection apart from the embeddings (llama.cpp's gemma2 reads the embeddings)"
    elif fields.get("use_bidirectional_attention"):
        found = "bidirectional attention"
    return differs(fields, found, "export.format=hf or onnx")


def add_metadata(writer, config, heads, kv_heads, head_dim: int, dtype: str, name: str, feed_forward=None, row: GGUFArch = LLAMA) -> None:
    """Model metadata; ``heads`` / ``kv_heads`` / ``feed_forward`` are one int, or one per layer (deci); ``row``'s own keys."""
    import gguf

    writer.add_name(name)
    writer.add_context_length(int(config.max_position_embeddings))
    writer.add_embedding_length(int(config.hidden_size))
    writer.add_feed_forward_length(int(config.intermediate_size) if feed_forward is None else feed_forward)
    writer.add_block_count(int(config.num_hidden_layers))
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    if row.rotary:
        add_rope(writer, config, head_dim)
    if not row.layer_norm:
        writer.add_layer_norm_rms_eps(float(config.rms_norm_eps))
    writer.add_vocab_size(int(config.vocab_size))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32 if dtype == "f32" else gguf.LlamaFileType.MOSTLY_F16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    if row.layer_norm:
        writer.add_layer_norm_eps(float(getattr(config, row.layer_norm)))
    if row.metadata is not None:
        row.metadata(writer, config)


def add_rope(writer, config, head_dim: int) -> None:
    """The rotary base, linear scaling, and the dimensions rotated (partial rotary: the first ``factor`` x head_dim)."""
    import gguf

    rope = getattr(config, "rope_parameters", None) or {}
    rope = rope.get("full_attention", rope)  # gemma3: one set per layer type, the sliding one in the row's metadata
    writer.add_rope_freq_base(float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))))
    if rope.get("rope_type") == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(float(rope["factor"]))
    factor = float(rope.get("partial_rotary_factor") or getattr(config, "rotary_pct", None) or 1.0)
    writer.add_rope_dimension_count(int(head_dim * factor))  # GPT-NeoX: rotary_ndims = int(head_size * rotary_pct)


def check_bpe(tokenizer) -> None:
    """A ConfigError unless ``tokenizer`` is a byte-level BPE (the only kind the GGUF writer writes)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or type(backend.model).__name__ != "BPE":
        raise ConfigError(
            f"export.format=gguf writes byte-level BPE tokenizers (tokenizer.ggml.model gpt2); this model's tokenizer is "
            f"{type(tokenizer).__name__}: use export.format=hf or onnx"
        )


def add_tokenizer(writer, tokenizer, vocab_size: int, pre: str | None) -> None:
    """The byte-level BPE tokenizer as llama.cpp's converter writes it; ``pre`` its pre-tokenizer (None: the one llama.cpp identifies)."""
    import gguf

    from headprune.export.gguf_pre import pre_tokenizer_of

    check_bpe(tokenizer)
    vocab = tokenizer.get_vocab()
    if max(vocab.values()) >= vocab_size:
        raise ValueError(f"the tokenizer has ids up to {max(vocab.values())}, beyond the model's vocabulary of {vocab_size}")
    by_id = {i: token for token, i in vocab.items()}
    added = tokenizer.get_added_vocab()
    decoder = tokenizer.added_tokens_decoder
    added_type = {i: gguf.TokenType.CONTROL if decoder[i].special else gguf.TokenType.USER_DEFINED for i in by_id if by_id[i] in added}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_tokenizer_of(tokenizer, pre))
    writer.add_token_list([by_id.get(i, f"[PAD{i}]") for i in range(vocab_size)])  # an id no token has: an unused filler
    writer.add_token_types([added_type.get(i, gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED) for i in range(vocab_size)])
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save_pretrained(folder)
        special = gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size)
    if not special.merges:
        raise ConfigError(
            "the tokenizer has no BPE merges (a vocabulary of single bytes), which llama.cpp's gpt2 tokenizer needs: "
            "train it with a larger vocabulary (data.tokenizer.vocab_size), or remove fewer tokens (prune.unit=vocab)"
        )
    special.add_to_gguf(writer, quiet=True)


def gguf_tensors(model: nn.Module, layer_heads: list[tuple[int, int]], dtype: str, row: GGUFArch, arch, skip=None, unfuse=None):
    """(GGUF name, numpy array) of every weight ``skip`` keeps, as ``row`` writes it: a layer's tensors converted by ``unfuse``,
    names mapped (``arch``'s: gguf's MODEL_ARCH), q/k permuted per layer where llama.cpp rotates interleaved pairs, matrices
    f16 for ``dtype=f16``."""
    import gguf

    config = model.config
    names = gguf.get_tensor_name_map(arch, int(config.num_hidden_layers))
    pairs = model.state_dict().items()
    if unfuse is not None:  # (HF name, tensor, heads, KV heads) -> [(HF name, tensor)]: fused projections split, as Llama's
        pairs = [p for n, t in pairs for p in ([(n, t)] if layer_index(n) is None else unfuse(n, t, *layer_heads[layer_index(n)]))]
    for hf_name, tensor in pairs:
        tied = hf_name == "lm_head.weight" and config.tie_word_embeddings and not row.always_output  # llama.cpp reads token_embd
        if (skip and skip(hf_name)) or tied or hf_name.endswith("rotary_emb.inv_freq"):
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise ValueError(f"no GGUF name for tensor {hf_name} of {type(model).__name__}")
        data = tensor.detach().to("cpu", torch.float32)
        if row.norm_offset and name.endswith("norm.weight"):
            data = data + row.norm_offset  # Gemma: (1 + w) as llama.cpp's w
        if row.interleaved_rotary and hf_name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
            heads, kv_heads = layer_heads[layer_index(hf_name)]
            data = permute_rotary(data, heads if ".q_proj." in hf_name else kv_heads)
        array = data.numpy()
        if dtype == "f16" and array.ndim > 1 and not name.endswith("_norm.weight"):
            array = array.astype(np.float16)
        yield name, np.ascontiguousarray(array)


LAYER_NAME = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)\.")  # model.layers.<i>. (gpt2: transformer.h.<i>.)


def layer_index(hf_name: str) -> int | None:
    """The layer index of a decoder weight name (``model.layers.<i>.``..., ``transformer.h.<i>.``...), None outside the layers."""
    found = LAYER_NAME.search(hf_name)
    return None if found is None else int(found.group(1))


def rounded_like_gguf(model: nn.Module, dtype: str) -> nn.Module:
    """``model`` with the weights rounded as the GGUF stores them (f16: every matrix), for the reference of the check."""
    if dtype == "f32":
        return model
    import copy

    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for parameter in rounded.parameters():
            if parameter.dim() > 1:
                parameter.copy_(parameter.to(torch.float16).to(parameter.dtype))
    return rounded


def check_writable(model: nn.Module, dtype: str) -> None:
    """A ConfigError unless GGUF can store this model (its family and settings) in ``dtype``."""
    if dtype not in DTYPES:
        raise ConfigError(f"export.gguf_dtype must be one of {list(DTYPES)}, got {dtype!r}")
    if why := refusal(model.config.to_dict()):
        raise ConfigError(why)


def export_gguf(
    model: nn.Module, tokenizer, out: Path, dtype: str = "f32", name: str = "model", tokenizer_pre: str | None = None
) -> tuple[Path, str]:
    """Write ``<out>/<name>-<dtype>.gguf`` of a uniformly pruned model in its family's llama.cpp architecture; (file, architecture)."""
    config = model.config
    shape, family = stock_shape(model, GGUF_TYPES), arch_of(config.model_type)
    # an architecture reading square attention matrices: other widths written as llama (same q/k/v biases, rotary permuted)
    row = LLAMA if family.square_attention and shape.heads * shape.head_dim != int(config.hidden_size) else family
    layer_heads = [(shape.heads, shape.kv_heads)] * int(config.num_hidden_layers)
    unfuse = family.unfuse if row is LLAMA else row.convert  # phi3 as llama: its fused projections split
    kept = stock_ffn_width(model)  # {config field: the FFN width every layer computes}; none: the config's unpruned one
    unpruned = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or getattr(config, "ffn_hidden_size", None)
    feed_forward = next(iter(kept.values())) if kept else int(unpruned or 4 * config.hidden_size)  # GPT-2's n_inner None: 4 x n_embd
    path = write_file(model, tokenizer, out, (dtype, name, tokenizer_pre), row, layer_heads, shape.head_dim, feed_forward, unfuse=unfuse)
    return path, row.name


def write_file(
    model: nn.Module, tokenizer, out: Path, options: tuple, row, layer_heads: list, head_dim: int, feed_forward, deci=False, **tensors
) -> Path:
    """Write ``<out>/<name>-<dtype>.gguf`` (``options``: dtype, name, pre-tokenizer) as ``row``'s architecture, or (``deci``)
    llama.cpp's deci with per-layer (heads, KV heads) and ``feed_forward`` widths; ``tensors``: gguf_tensors' skip and unfuse."""
    import gguf

    dtype, name, tokenizer_pre = options
    arch = gguf.MODEL_ARCH.DECI if deci else row.arch
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}-{dtype}.gguf"
    writer = gguf.GGUFWriter(str(path), arch=gguf.MODEL_ARCH_NAMES[arch])
    heads, kv_heads = [list(counts) for counts in zip(*layer_heads)] if deci else layer_heads[0]  # deci: one count per layer
    add_metadata(writer, model.config, heads, kv_heads, head_dim, dtype, safe_name(name, tokenizer), feed_forward, row)
    add_tokenizer(writer, tokenizer, int(model.config.vocab_size), tokenizer_pre)
    for tensor_name, array in gguf_tensors(model, layer_heads, dtype, row, arch, **tensors):
        writer.add_tensor(tensor_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def safe_name(name: str, tokenizer) -> str:
    """``general.name`` for ``name``: llama.cpp looks up the token ``<|end|>`` in a model whose name holds phi3 or phi-3 (any
    case) and fails to load without it, so such a name is written "Phi 3" where the tokenizer has no ``<|end|>``."""
    has_end = tokenizer is not None and "<|end|>" in tokenizer.get_vocab()
    return name if has_end else re.sub(r"(?i)phi-?3", "Phi 3", name)
