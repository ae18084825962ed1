"""GGUF exports of each non-Llama family's tiny decoder (clients/cases.py ``tiny_family``) for llama.cpp: unpruned, and
pruned uniformly (one KV group and half the FFN neurons of every layer), f32 and f16."""

from __future__ import annotations

from pathlib import Path

from clients.cases import JOINT, TINY_FAMILY_CONFIGS, TINY_TEXTS, TRAINED_PRE, export_case, joint_mask, tiny_family

# llama.cpp's CPU GELU reads a float16 table (ggml's GGML_GELU_FP16): on these tiny Gemma files (weights x4) its logits
# differ from the exact tanh-GELU by up to 2.4e-3 of their scale (f32 file and cache), while a numpy model with that table
# agrees within 1e-5 (gemma2) and 2.4e-4 (gemma3): the tolerance of the GELU families, relative to the logits' scale
GELU_TOLERANCE = {"tolerance": 3e-3, "f16_tolerance": 2e-2}
GELU_FAMILIES = ("gemma2", "gemma3_text")


def family_jobs(out: Path, new_tokens: int, families=tuple(TINY_FAMILY_CONFIGS)) -> list[dict]:
    """The jobs of every family: ``<family> unpruned`` and ``<family> uniform`` in f32 and f16."""
    from headprune.core.units import unit_gates

    jobs = []
    for family in families:
        model, tokenizer = tiny_family(family)
        gates = unit_gates(model, JOINT)
        layers = model.config.num_hidden_layers
        uniform = joint_mask(gates, {layer: [1] for layer in range(layers)}, dict.fromkeys(range(layers), 32))
        masks = {"unpruned": gates.ones(), "uniform": uniform}
        gates.remove()
        for case, mask in masks.items():
            for dtype in ("f32", "f16"):
                job = export_case(
                    model, tokenizer, f"{family} {case}", mask, "gguf", dtype, out, TINY_TEXTS[:3], TRAINED_PRE, new_tokens, JOINT
                )
                jobs.append({**job, **GELU_TOLERANCE} if family in GELU_FAMILIES else job)
    return jobs
