"""GGUF exports of each non-Llama family's tiny decoder (clients/cases.py ``tiny_family``) for llama.cpp: unpruned, and
pruned uniformly (one KV group and half the FFN neurons of every layer), f32 and f16; gpt2, gpt_neox and falcon (llama.cpp's
graphs read square attention) and olmo2 (its q/k norms span all heads): no head pruned, unpruned, with half the FFN neurons
of every layer, and with layer 1 removed. Every family also compares llama.cpp's teacher-forced log-probabilities."""

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

# llama.cpp's CPU GELU reads a float16 table (ggml's GGML_GELU_FP16; clients/ggml_gelu.py): an f32 case of these families
# adds to its tolerance what that table alone moves the masked model by, computed per case (on these tiny files, weights x4:
# Gemma 3's logits 2.1e-3 unpruned and 7.7e-3 uniform, log-probs 1.3e-3 and 5.0e-3 nats; Gemma 2's 2.0e-3 and 9.8e-4 nats;
# Pythia's 3.4e-4 and 1.8e-4 nats, its exact GELU run as the tanh one through the table), while llama.cpp against the
# masked model with that table agrees within the f32 tolerances (Gemma 3 uniform: logits 2.7e-4 of their scale, log-probs
# 9e-5 nats; Gemma 2 and Pythia: 2e-5 of the scale, 1e-5 nats, or less). The f16 runs keep a wider tolerance of the scale.
GELU_TOLERANCE = {"f16_tolerance": 2e-2}
GELU_FAMILIES = ("gemma2", "gemma3_text", "gpt2", "gpt_neox", "falcon")  # gpt_neox, falcon: the exact GELU, llama.cpp's tanh
WHOLE_HEADS = (*TINY_GPT_CONFIGS, *TINY_WHOLE_HEAD_CONFIGS)  # no query head pruned: FFN neurons and layers
FAMILIES = (*TINY_FAMILY_CONFIGS, *WHOLE_HEADS)
# |log p(next token)| of llama.cpp against the masked model, teacher-forced over the prompts, every family: f32 file and
# cache (plus the GELU table's effect); otherwise
LOGPROB_TOLERANCE = {"logprob_tolerance": 1e-3, "f16_logprob_tolerance": 1e-1}


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
                if family in GELU_FAMILIES:
                    job = {**job, **GELU_TOLERANCE, **(gelu_effect(model, unit, mask, job) if dtype == "f32" else {})}
                jobs.append({**job, **LOGPROB_TOLERANCE})
    return jobs


def gelu_effect(model, unit, mask, job: dict) -> dict:
    """What llama.cpp's float16 GELU table moves this f32 case's masked model by (clients/ggml_gelu.py ``table_effect``)."""
    import numpy as np

    from clients.ggml_gelu import table_effect
    from headprune.core.units import unit_gates

    gates = unit_gates(model, unit)
    try:
        with np.load(job["arrays"]) as arrays:
            return table_effect(model, gates, mask, dict(arrays))
    finally:
        gates.remove()
