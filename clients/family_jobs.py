"""GGUF exports of each non-Llama family's tiny decoder (clients/cases.py ``tiny_family``) for llama.cpp: unpruned, and
pruned uniformly (one KV group and half the FFN neurons of every layer), f32 and f16; gpt2, gpt_neox and falcon (llama.cpp's
graphs read square attention) and olmo2 (its q/k norms span all heads): no head pruned, unpruned, with half the FFN neurons
of every layer, and with layer 1 removed. falcon and olmo2 also compare llama.cpp's teacher-forced log-probabilities."""

from __future__ import annotations

from pathlib import Path

from clients.cases import (
    JOINT,
    TINY_FAMILY_CONFIGS,
    TINY_GPT_CONFIGS,
    TINY_TEXTS,
    TINY_WHOLE_HEAD_CONFIGS,
    TRAINED_PRE,
    export_case,
    joint_mask,
    tiny_family,
)

# llama.cpp's CPU GELU reads a float16 table (ggml's GGML_GELU_FP16): on these tiny Gemma files (weights x4) its logits
# differ from the exact tanh-GELU by up to 2.4e-3 of their scale (f32 file and cache), while a numpy model with that table
# agrees within 1e-5 (gemma2) and 2.4e-4 (gemma3): the tolerance of the GELU families, relative to the logits' scale
GELU_TOLERANCE = {"tolerance": 3e-3, "f16_tolerance": 2e-2}
GELU_FAMILIES = ("gemma2", "gemma3_text", "gpt2", "gpt_neox", "falcon")  # gpt_neox, falcon: the exact GELU, llama.cpp's tanh
WHOLE_HEADS = (*TINY_GPT_CONFIGS, *TINY_WHOLE_HEAD_CONFIGS)  # no query head pruned: FFN neurons and layers
FAMILIES = (*TINY_FAMILY_CONFIGS, *WHOLE_HEADS)
# |log p(next token)| of llama.cpp against the masked model, teacher-forced over the prompts: f32 file and cache; otherwise
LOGPROB_TOLERANCE = {"logprob_tolerance": 1e-3, "f16_logprob_tolerance": 1e-1}
LOGPROB_FAMILIES = tuple(TINY_WHOLE_HEAD_CONFIGS)


def family_masks(model_type: str, gates, layers: int) -> dict:
    """{case: mask} of a family: unpruned and uniform (one KV group, 32 of 64 neurons per layer); the square-attention families
    and the others that keep every head unpruned, ``ffn`` (32 neurons per layer) and ``layer`` (layer 1 removed)."""
    if model_type not in WHOLE_HEADS:
        return {
            "unpruned": gates.ones(),
            "uniform": joint_mask(gates, {layer: [1] for layer in range(layers)}, dict.fromkeys(range(layers), 32)),
        }
    ffn, layer = gates.ones(), gates.ones()
    ffn["dec_ffn"][:, 32:] = 0.0
    layer["dec_layer"][1] = 0.0
    return {"unpruned": gates.ones(), "ffn": ffn, "layer": layer}


def family_jobs(out: Path, new_tokens: int, families=FAMILIES) -> list[dict]:
    """The jobs of every family: ``<family> <case>`` of ``family_masks`` in f32 and f16."""
    from headprune.core.units import unit_gates

    jobs = []
    for family in families:
        model, tokenizer = tiny_family(family)
        unit = ["ffn", "layer"] if family in WHOLE_HEADS else JOINT
        gates = unit_gates(model, unit)
        masks = family_masks(family, gates, model.config.num_hidden_layers)
        gates.remove()
        for case, mask in masks.items():
            for dtype in ("f32", "f16"):
                job = export_case(
                    model, tokenizer, f"{family} {case}", mask, "gguf", dtype, out, TINY_TEXTS[:3], TRAINED_PRE, new_tokens, unit
                )
                job = {**job, **GELU_TOLERANCE} if family in GELU_FAMILIES else job
                jobs.append({**job, **LOGPROB_TOLERANCE} if family in LOGPROB_FAMILIES else job)
    return jobs
