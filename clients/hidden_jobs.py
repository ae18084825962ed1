"""``make test-clients``, residual channels: GGUF files of models pruned in ``[kv_group, ffn, hidden]`` for llama.cpp.

The residual stream keeps fewer channels, one width for the network, while every head keeps its size: the file says
both (``embedding_length``, ``attention.key_length`` / ``value_length``), and llama.cpp reads the head size from the
latter, so a kept width that no head count divides runs as it is. Cases (clients/clients_check.py runs them like the others):

- the tiny Llama of clients/cases.py with 21 of its 32 channels, uneven KV heads and FFN widths (``deci``, f32 and
  f16), and with 20 channels and one KV head per layer (``llama``, f32 and f16);
- SmolLM2 with 500 of its 576 channels and the KV heads and FFN widths of its ``ffn-emptied`` case (``deci``), and with
  504 channels and 2 KV heads per layer (``llama``), f32. It keeps its loudest channels (``cases.loudest_first``): with 72
  channels drawn at random its float32 logits moved by 7e-5 of their scale against float64, beyond the f32 tolerance,
  whatever runs them.

The vLLM cases (``deci_hf``) are in clients/vllm_jobs.py.
"""

from __future__ import annotations

from pathlib import Path

from clients import cases
from clients.cases import HIDDEN


def hidden_jobs(out: Path, new_tokens: int) -> list[dict]:
    """Export every case as GGUF with its masked reference: the jobs for clients/clients_check.py."""
    from headprune.core.units import unit_gates

    model, tokenizer = cases.tiny_llama()
    joint = unit_gates(model, HIDDEN)
    tiny = {
        "tiny hidden-global": cases.joint_mask(joint, {1: [0], 3: [1]}, {0: 40, 2: 17}, 21),  # 21 channels: no multiple of the heads
        "tiny hidden-uniform": cases.joint_mask(joint, {layer: [1] for layer in range(4)}, {}, 20),
    }
    joint.remove()
    jobs = [
        cases.export_case(
            model, tokenizer, name, mask, "gguf", dtype, out, cases.TINY_TEXTS[:3], cases.TRAINED_PRE, min(new_tokens, 20), HIDDEN
        )
        for name, mask in tiny.items()
        for dtype in ("f32", "f16")
    ]
    model, tokenizer, pre = cases.load_smollm2()
    order = cases.loudest_first(model, tokenizer, cases.SMOL_TEXTS)
    joint = unit_gates(model, HIDDEN)
    smollm2 = {
        "smollm2 hidden-global": cases.joint_mask(joint, cases.SMOL_UNEVEN, cases.SMOL_WIDTHS, 500, order),
        "smollm2 hidden-uniform": cases.joint_mask(joint, {layer: [2] for layer in range(30)}, {}, 504, order),
    }
    joint.remove()
    jobs += [
        cases.export_case(model, tokenizer, name, mask, "gguf", "f32", out, cases.SMOL_TEXTS, pre, new_tokens, HIDDEN)
        for name, mask in smollm2.items()
    ]
    return jobs
