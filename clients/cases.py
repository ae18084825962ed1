"""The cases every client check builds on: tiny and SmolLM2 models, their masks, and an export with its masked reference."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import torch

JOINT = ["kv_group", "ffn"]  # the unit of the FFN cases: prune.unit=[kv_group,ffn]
HIDDEN = [*JOINT, "hidden"]  # with residual channels too
JOINT_VOCAB = [*JOINT, "vocab"]  # KV groups, FFN neurons and token rows
TOLERANCE = {"hf": 1e-5, "f32": 3e-5, "f16": 1e-2}  # |logits - masked| over the logits' scale (at least 1); f16: any rounding
TRAINED_PRE = "gpt-2"  # the tiny model's tokenizer is trained here: its byte-level splitting named by hand
TINY_TEXTS = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
SMOL_TEXTS = [
    "The history of the city goes back to the Roman period, when a small fort was built on the river.",
    "Researchers said on Tuesday that the new vaccine had been tested on more than two thousand volunteers.",
    "If you want to learn a language quickly, the best thing you can do is to speak it every day.",
]
SMOL_UNEVEN = {**{layer: list(range(layer % 3)) for layer in range(30)}, 15: [0, 1, 2]}  # 3, 2, 1 KV groups in turn; 15 emptied
SMOL_WIDTHS = {**{layer: 1536 - 41 * layer for layer in range(30)}, 15: 0, 20: 0}  # none a multiple of 32 past layer 0


def kv_mask(gates, removed: dict[int, list[int]], heads_per_kv: int) -> dict:
    """The query-head mask that removes KV groups {layer: [KV ids]} (each with all of its query heads)."""
    mask = gates.ones()
    group = next(iter(mask))
    for layer, kv_ids in removed.items():
        for kv in kv_ids:
            mask[group][layer, kv * heads_per_kv : (kv + 1) * heads_per_kv] = 0.0
    return mask


@torch.no_grad()
def masked_outputs(model, gates, mask, prompts: list[list[int]], new_tokens: int, kept: list[int] | None = None) -> dict:
    """The masked model's logits on every prompt, its greedy continuation and each greedy token's log-probability (no
    cache: the plain definition); ``kept``: the original ids the prompts' ids stand for (a renumbered vocabulary), the
    model reading those and its logits taken at them."""
    columns = None if kept is None else torch.tensor(kept, dtype=torch.long)

    def logits(ids):  # (T, vocabulary of the file)
        out = model(input_ids=ids if columns is None else columns[ids]).logits[0]
        return out if columns is None else out[:, columns]

    arrays = {}
    with gates.masked(mask):
        for i, prompt in enumerate(prompts):
            ids = torch.tensor([prompt])
            arrays[f"prompt{i}"] = np.array(prompt, dtype=np.int64)
            arrays[f"reference{i}"] = logits(ids).float().numpy()
            logprobs = []
            for _ in range(new_tokens):
                last = logits(ids)[-1].double()
                ids = torch.cat([ids, last.argmax().view(1, 1)], dim=1)
                logprobs.append(float(torch.log_softmax(last, -1)[ids[0, -1]]))
            arrays[f"greedy{i}"] = ids[0, len(prompt) :].numpy()
            arrays[f"logprobs{i}"] = np.array(logprobs)
    return arrays


def export_case(
    model, tokenizer, name: str, mask, fmt: str, dtype: str, out: Path, texts: list[str], tokenizer_pre: str, new_tokens: int, unit="head"
):
    """Prune a copy by ``mask`` (in ``unit``: query heads, or ``[kv_group, ffn]``), export it, and compute the reference:
    one job for the clients."""
    from headprune.core.attention.gates import HeadGates
    from headprune.core.ffn.sites import ffn_sites_if_any
    from headprune.core.units import prune_unit_mask, unit_gates
    from headprune.export import export_model
    from headprune.export.gguf import rounded_like_gguf
    from headprune.export.renumbering import renumbering

    gates = unit_gates(model, unit)
    pruned = copy.deepcopy(model)
    pruned_gates = unit_gates(pruned, unit)
    prune_unit_mask(pruned_gates, {g: m.clone() for g, m in mask.items()})
    pruned_gates.remove()
    ids = renumbering(pruned, tokenizer)  # a vocab mask: the file's ids and the rewritten tokenizer it ships
    ids.apply(pruned)
    folder = out / f"{name}-{fmt}-{dtype}"
    exported = export_model(fmt, pruned, ids.tokenizer, folder, {}, dtype, name, tokenizer_pre)
    prompts = [ids.tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    if dtype == "f16":  # the reference holds the matrices as the file stores them
        rounded = rounded_like_gguf(pruned, dtype)
        arrays = masked_outputs(rounded, HeadGates(rounded), None, prompts, new_tokens)
    else:
        arrays = masked_outputs(model, gates, mask, prompts, new_tokens, ids.kept)
    gates.remove()
    np.savez(folder / "arrays.npz", **arrays)
    path = folder if fmt in ("hf", "deci_hf") else exported["files"][0]
    layers = [(len(s.head_ids), len(s.kv_ids)) for s in HeadGates(pruned).sites]
    job = {
        "name": f"{name} {fmt} {dtype if fmt == 'gguf' else ''}".strip() + (f" ({exported['architecture']})" if fmt == "gguf" else ""),
        "format": fmt,
        "path": str(path),
        "arrays": str(folder / "arrays.npz"),
        "prompts": len(prompts),
        "tolerance": TOLERANCE["hf" if fmt == "hf" else dtype],
        "f16_tolerance": TOLERANCE["f16"],  # f16 files, flash attention, llama.cpp's default f16 KV cache
        "dtype": dtype,
        "texts": texts,
        "text_ids": prompts,
        "expect": exported.get("architecture", "LlamaForCausalLM"),
        # a test tokenizer adds a prefix space no llama.cpp pre-tokenizer adds: its ids are checked on texts that start with one
        "check_tokenizer": tokenizer_pre != TRAINED_PRE or all(text.startswith(" ") for text in texts),
        "layers": [list(shape) for shape in layers],
        "ffn_widths": [site.width for site in ffn_sites_if_any(pruned)],  # neurons each layer keeps (0: emptied)
        "head_dim": int(getattr(pruned.config, "head_dim", None) or pruned.config.hidden_size // pruned.config.num_attention_heads),
    }
    if fmt == "gguf":
        job["file_layout"] = gguf_layout(path)
    return job


def gguf_layout(path) -> dict:
    """The per-layer counts a GGUF file holds (gguf package): head_count, head_count_kv, feed_forward_length."""
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    architecture = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    layout = {}
    for key in ("attention.head_count", "attention.head_count_kv", "feed_forward_length"):
        field = reader.fields[f"{architecture}.{key}"]
        layout[key.split(".")[-1]] = [int(field.parts[i][0]) for i in field.data]
    return layout


def expected_deci_layout(layers: list[list[int]], widths: list[int]) -> dict:
    """The deci counts llama.cpp needs for a pruned model, by deci's graph (src/models/deci.cpp): an emptied layer 0 keeps
    one zero head (the head size is read from layer 0); a layer whose FFN is emptied says 0 only where its attention is
    skipped too (deci ends a layer with n_ff 0 before adding the attention output), else 1 (one zero neuron)."""
    written = [[1, 1] if layer == 0 and heads == 0 else [heads, kv] for layer, (heads, kv) in enumerate(layers)]
    last = len(written) - 1
    ffn = [width or (0 if heads == 0 and layer != last else 1) for layer, ((heads, _), width) in enumerate(zip(written, widths))]
    return {"head_count": [h for h, _ in written], "head_count_kv": [kv for _, kv in written], "feed_forward_length": ffn}


def vocab_row(model, tokenizer, every: int = 3) -> torch.Tensor:
    """A vocab mask row [1, V]: every ``every``-th token beyond the tokenizer's floor (special tokens, the 256 bytes) removed."""
    from headprune.core.kinds import KINDS
    from headprune.core.units import unit_gates

    floor = KINDS["vocab"].floor(unit_gates(model, "vocab"), tokenizer, [])["vocab"]  # (1, V) bool: never removed
    row = torch.ones(floor.shape)
    row[0, (~floor[0]).nonzero().flatten()[::every]] = 0.0
    return row


def joint_mask(gates, removed_kv: dict[int, list[int]], kept_neurons: dict[int, int], kept_channels: int | None = None, order=None) -> dict:
    """A ``[kv_group, ffn]`` mask: KV groups {layer: [ids]} removed, and each listed layer's FFN cut to its first
    ``kept_neurons[layer]`` neurons of a fixed random order (0: the FFN emptied); with ``kept_channels`` (unit
    ``[kv_group, ffn, hidden]``) the residual stream cut to the first that many channels of ``order`` (default: another
    fixed random order)."""
    mask = gates.ones()
    if kept_channels is not None:
        width = mask["hidden"].shape[1]
        order = torch.randperm(width, generator=torch.Generator().manual_seed(2)) if order is None else order
        mask["hidden"][0, order[kept_channels:]] = 0.0
    attention, ffn = "dec_self", "dec_ffn"
    for layer, kv_ids in removed_kv.items():
        mask[attention][layer, kv_ids] = 0.0
    generator = torch.Generator().manual_seed(1)
    width = mask[ffn].shape[1]
    for layer, kept in kept_neurons.items():
        mask[ffn][layer, torch.randperm(width, generator=generator)[kept:]] = 0.0
    return mask


def tiny_llama(**sizes):
    """A random 4-layer Llama (by default hidden 32, 4 query heads over 2 KV heads of size 8; ``sizes`` override its
    config) and its trained BPE tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from headprune.models.tokenizers import train_tokenizer

    tokenizer = train_tokenizer(TINY_TEXTS * 5, vocab_size=300)
    torch.manual_seed(0)
    shape = {"hidden_size": 32, "intermediate_size": 64, "head_dim": 8, "max_position_embeddings": 64, **sizes}
    config = LlamaConfig(
        vocab_size=len(tokenizer), num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, **shape,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)  # larger logits than at init: differences in the last digits show
    return model, tokenizer


def load_smollm2():
    """The embedded SmolLM2-135M (30 layers x 9 query heads over 3 KV heads), its tokenizer and llama.cpp's pre-tokenizer name."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from headprune.models.embedded import embedded_model_dir
    from headprune.models.tokenizer_origin import embedded_origin

    folder = embedded_model_dir("smollm2")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    origin = embedded_origin("smollm2")
    return model, AutoTokenizer.from_pretrained(folder), origin["tokenizer_pre"] if origin else None


@torch.no_grad()
def loudest_first(model, tokenizer, texts: list[str]) -> torch.Tensor:
    """Residual channel ids by their largest |value| in the unpruned stream (any layer, any token of ``texts``), largest first."""
    loudness = torch.zeros(model.config.hidden_size)
    for text in texts:
        states = model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states
        loudness = torch.maximum(loudness, torch.stack([state[0].abs().amax(0) for state in states]).amax(0))
    return loudness.argsort(descending=True)


TINY_FAMILY_CONFIGS = {  # the config class and fields of each family's tiny decoder beyond tiny_llama's shape
    "qwen2": ("Qwen2Config", {}),  # q/k/v biases; head size hidden / heads (8)
    "qwen3": ("Qwen3Config", {"head_dim": 8}),  # per-head q/k norms
    "granite": (
        "GraniteConfig",
        {"embedding_multiplier": 3.0, "residual_multiplier": 0.5, "attention_multiplier": 0.25, "logits_scaling": 2.0},
    ),
    "phi3": ("Phi3Config", {}),  # fused qkv_proj and gate_up_proj
    "gemma2": (  # norms (1 + w), embeddings x sqrt(hidden), soft-capping, a sliding window every other layer
        "Gemma2Config",
        {"head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 4, "attn_logit_softcapping": 2.0, "final_logit_softcapping": 5.0},
    ),
    "gemma3_text": (  # per-head q/k norms, a rotary base per layer type; 6 layers: llama.cpp's one global layer in 6
        "Gemma3TextConfig",
        {"head_dim": 8, "query_pre_attn_scalar": 8, "sliding_window": 4, "num_hidden_layers": 6},
    ),
}


TINY_GPT_CONFIGS = {  # the config class and whole shape of the families without KV groups (hidden 32, 4 heads of 8, FFN 64)
    "gpt2": ("GPT2Config", {"n_embd": 32, "n_layer": 4, "n_head": 4, "n_inner": 64, "n_positions": 64}),  # Conv1D, learned positions
    "gpt_neox": (  # per-head fused q/k/v, rotary over half of each head, parallel residual, Pythia's exact GELU
        "GPTNeoXConfig",
        {
            "hidden_size": 32,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        },
    ),
}


TINY_WHOLE_HEAD_CONFIGS = {  # grouped families whose GGUF keeps every query head (hidden 32, 4 heads over 2 KV heads of 8)
    "falcon": (  # new_decoder_architecture: per KV group [q | q | k | v], two LayerNorms side by side, no biases
        "FalconConfig",
        {
            "hidden_size": 32,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_kv_heads": 2,
            "new_decoder_architecture": True,
            "bias": False,
            "alibi": False,
            "ffn_hidden_size": 64,
            "activation": "gelu_pytorch_tanh",  # llama.cpp's GELU: the exact one (Falcon's default) is 1.3e-3 nats off here
            "max_position_embeddings": 64,
        },
    ),
    "olmo2": (  # norms on the attention and FFN outputs only, q/k RMS norms over all heads together
        "Olmo2Config",
        {
            "hidden_size": 32,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 64,
            "max_position_embeddings": 64,
        },
    ),
}


def tiny_family(model_type: str):
    """A random 4-layer decoder of ``model_type`` (hidden 32, 4 query heads over 2 KV heads of size 8, FFN 64; gpt2 and
    gpt_neox: 4 heads of 8), with its family's own parts made visible (biases, norms and multipliers away from their
    initial values), and tiny_llama's trained BPE tokenizer."""
    import transformers
    from transformers import AutoModelForCausalLM

    from headprune.models.tokenizers import train_tokenizer

    tokenizer = train_tokenizer(TINY_TEXTS * 5, vocab_size=300)
    torch.manual_seed(0)
    if model_type in TINY_GPT_CONFIGS or model_type in TINY_WHOLE_HEAD_CONFIGS:
        config_class, shape = {**TINY_GPT_CONFIGS, **TINY_WHOLE_HEAD_CONFIGS}[model_type]
    else:
        config_class, fields = TINY_FAMILY_CONFIGS[model_type]
        grouped = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 32, "intermediate_size": 64}
        shape = {**grouped, "max_position_embeddings": 64, "num_hidden_layers": 4, **fields}
    config = getattr(transformers, config_class)(
        vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, **shape,
    )  # fmt: skip
    attention = "eager" if model_type == "gemma2" else "sdpa"  # Gemma 2's soft-capping runs in eager attention only
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name or ".ln_attn." in name or ".ln_mlp." in name:  # zeros and ones at init:
                # random so that a missed one shows (Falcon's two LayerNorms side by side: ln_attn, ln_mlp)
                parameter.copy_(torch.randn_like(parameter) * 0.5 + (0.0 if name.endswith("bias") else 1.0))
            else:
                parameter.mul_(4.0)  # larger logits than at init: differences in the last digits show
    return model, tokenizer
