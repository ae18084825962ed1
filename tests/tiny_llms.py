"""Tiny random decoder-only LLMs with grouped KV heads, and a causal-LM batch and loss for them."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def tiny_llama(seed: int = 0, layers: int = 3, heads: int = 4, kv_heads: int = 2, attn: str = "sdpa", dtype=torch.float32):
    """A random Llama causal LM: hidden 32, ``heads`` query heads over ``kv_heads`` KV heads of dim 8."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=8,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation=attn,
    )
    return LlamaForCausalLM(config).to(dtype).eval()


def tiny_qwen2(seed: int = 0, attn: str = "sdpa"):
    """A random Qwen2 causal LM (q/k/v biases): 2 layers, 6 query heads over 2 KV heads (3 per group)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=64,
        hidden_size=48,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        attn_implementation=attn,
    )
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, 0.5)  # non-zero biases: a pruned KV head must take its bias rows along
    return model


def lm_batch(seed: int = 0, batch: int = 3, length: int = 9, vocab: int = 64, left_pad: bool = False) -> dict:
    """Token ids with ragged padding (right, or left for generation) and labels with -100 on padding."""
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (batch, length), generator=gen)
    attention_mask = torch.ones_like(input_ids)
    for row in range(batch):
        pad = slice(0, row) if left_pad else slice(length - row, length)
        attention_mask[row, pad] = 0
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": input_ids.masked_fill(attention_mask == 0, -100)}


def causal_lm_loss(outputs, batch: dict) -> torch.Tensor:
    """Mean next-token NLL of each sequence (B,), written out independently of headprune's LM task."""
    logits = outputs.logits[:, :-1]
    logits = logits if logits.dtype == torch.float64 else logits.float()
    labels = batch["labels"][:, 1:]
    nll = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")  # (B, T-1)
    valid = (labels != -100).float()
    return (nll * valid).sum(1) / valid.sum(1).clamp(min=1)


def tiny_decoder(model_type: str, seed: int = 0):
    """A random causal LM of another Llama-like type (mistral, qwen3): 2 layers, 4 query heads over 2 KV heads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(
        model_type,
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


# One tiny random config per decoder family of headprune/core/families.py: 3 layers, 4 query heads (2 KV heads where the
# family groups them), vocabulary 64; the quirk each family brings is switched on (fused q/k/v, Conv1D, partial rotary,
# head_dim apart from hidden / heads, soft-capping, sliding windows, q/k norms, Granite's multipliers).
_SIZES = dict(vocab_size=64, hidden_size=32, num_hidden_layers=3, num_attention_heads=4, max_position_embeddings=64)
_GQA = dict(_SIZES, intermediate_size=64, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0)
_LAYER_TYPES = ["sliding_attention", "full_attention", "sliding_attention"]
_GEMMA = dict(_GQA, head_dim=16, query_pre_attn_scalar=16, sliding_window=4)
DECODER_CONFIGS = {
    "gpt2": dict(vocab_size=64, n_embd=32, n_layer=3, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2),
    "gpt_neox": dict(
        _SIZES, intermediate_size=64, rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}
    ),
    "opt": dict(_SIZES, ffn_dim=64, word_embed_proj_dim=32, bos_token_id=1, eos_token_id=2, pad_token_id=0),
    "phi3": dict(_GQA),
    "gemma2": dict(_GEMMA, attn_logit_softcapping=2.0, final_logit_softcapping=5.0, layer_types=_LAYER_TYPES),
    "gemma3_text": dict(_GEMMA, layer_types=_LAYER_TYPES),
    "olmo2": dict(_GQA),
    "falcon": dict(_SIZES, alibi=False, multi_query=True, new_decoder_architecture=False, bias=True, bos_token_id=1, eos_token_id=2),
    "granite": dict(_GQA, attention_multiplier=0.3, embedding_multiplier=2.0, residual_multiplier=0.5, logits_scaling=4.0),
}
# the Llama-like types the family tests cover through tiny_llama / tiny_qwen2 / tiny_decoder, in tiny_family's shape
LLAMA_LIKE_CONFIGS = {"qwen2": dict(_GQA), "qwen3": dict(_GQA, head_dim=8)}


def tiny_family(model_type: str, seed: int = 0, attn: str = "sdpa"):
    """A random causal LM of one decoder family (``DECODER_CONFIGS``, ``LLAMA_LIKE_CONFIGS``), with random biases and norm weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **{**DECODER_CONFIGS, **LLAMA_LIKE_CONFIGS}[model_type])
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.normal_(0, 0.3).add_(1.0 if "norm" in name and name.endswith("weight") else 0.0)
    return model
