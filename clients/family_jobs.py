"""GGUF exports of each non-Llama family's tiny decoder (clients/cases.py ``tiny_family``) for llama.cpp: unpruned, and
pruned uniformly (one KV group and half the FFN neurons of every layer), f32 and f16."""

from __future__ import annotations

from pathlib import Path

from clients.cases import JOINT, TINY_FAMILY_CONFIGS, TINY_TEXTS, TRAINED_PRE, export_case, joint_mask, tiny_family


def family_jobs(out: Path, new_tokens: int, families=tuple(TINY_FAMILY_CONFIGS)) -> list[dict]:
    """The jobs of every family: ``<family> unpruned`` and ``<family> uniform`` in f32 and f16."""
    from headprune.core.units import unit_gates

    jobs = []
    for family in families:
        model, tokenizer = tiny_family(family)
        gates = unit_gates(model, JOINT)
        masks = {"unpruned": gates.ones(), "uniform": joint_mask(gates, {layer: [1] for layer in range(4)}, dict.fromkeys(range(4), 32))}
        gates.remove()
        for case, mask in masks.items():
            for dtype in ("f32", "f16"):
                job = export_case(
                    model, tokenizer, f"{family} {case}", mask, "gguf", dtype, out, TINY_TEXTS[:3], TRAINED_PRE, new_tokens, JOINT
                )
                jobs.append(job)
    return jobs
