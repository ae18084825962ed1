"""``make test-clients``, vLLM: ``deci_hf`` exports run by vLLM's CPU build against the masked model.

A random 4-layer Llama with head size 32 (vLLM's CPU attention refuses head size 8, the tiny model's of
tools/test_clients.py), 4 query heads over 2 KV heads, tied embeddings, and the embedded SmolLM2-135M, pruned in these
layouts and exported as ``deci_hf``:

- ``joint``: uneven KV heads and FFN widths, an FFN emptied beside attention, the last layer emptied;
- ``heads``: a query-head mask with layer 0 emptied (vLLM's placeholder attention) and a query head padded back;
- ``ffn-only``: FFN widths alone (odd, uneven); ``kv-only``: one KV head in every layer;
- SmolLM2: 3 or 1 KV heads per layer (the counts that divide its 9 query heads), uneven FFN widths, layer 15 emptied.

headprune/export/vllm_client.py runs each directory in ``.clients/vllm-venv`` (no headprune): greedy tokens equal, and their
log-probabilities within 1e-4 of the masked model's (float32 on both sides).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import torch

VLLM_CLIENT = Path(__file__).resolve().parents[1] / "headprune" / "export" / "vllm_client.py"  # run as a file, without headprune
LOGPROB_TOLERANCE = 1e-4  # float32 on both sides; measured differences about 1e-5
JOINT = ["kv_group", "ffn"]


def tiny_model():
    """The head-size-32 Llama and its trained BPE tokenizer."""
    from test_clients import TINY_TEXTS
    from transformers import LlamaConfig, LlamaForCausalLM

    from headprune.models.tokenizers import train_tokenizer

    tokenizer = train_tokenizer(TINY_TEXTS * 5, vocab_size=300)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, max_position_embeddings=128, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)  # larger logits than at init: differences in the last digits show
    return model, tokenizer


def tiny_masks(model) -> dict[str, tuple[dict, object]]:
    """{name: (mask, unit)} of the tiny model's layouts."""
    from test_clients import joint_mask, kv_mask

    from headprune.core.gates import HeadGates
    from headprune.core.units import unit_gates

    joint = unit_gates(model, JOINT)
    masks = {
        "tiny32 joint": (joint_mask(joint, {1: [0], 3: [0, 1]}, {0: 50, 1: 33, 2: 0, 3: 0}), JOINT),  # last layer all gone
        "tiny32 ffn-only": (joint_mask(joint, {}, {0: 51, 1: 23, 2: 96, 3: 9}), JOINT),
    }
    joint.remove()
    heads = HeadGates(model)
    query = kv_mask(heads, {0: [0, 1]}, 2)  # layer 0 emptied: its FFN runs before any attention
    query["dec_self"][2, 3] = 0.0  # one query head of layer 2's second KV head: written back as a zero head
    masks["tiny32 heads"] = (query, "head")
    masks["tiny32 kv-only"] = (kv_mask(heads, {layer: [1] for layer in range(4)}, 2), "head")  # one KV head per layer
    heads.remove()
    return masks


def smollm2_case():
    """SmolLM2, its tokenizer and a ``[kv_group, ffn]`` mask vLLM takes (3 or 1 KV heads per layer)."""
    from test_clients import joint_mask
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from headprune.core.units import unit_gates
    from headprune.models.embedded import embedded_model_dir

    folder = embedded_model_dir("smollm2")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    joint = unit_gates(model, JOINT)
    removed = {layer: [1, 2] for layer in range(0, 30, 2)}  # even layers keep one KV head
    removed[15] = [0, 1, 2]
    mask = joint_mask(joint, removed, {**{layer: 1536 - 37 * layer for layer in range(30)}, 15: 0})
    joint.remove()
    return model, tokenizer, mask


def vllm_jobs(out: Path, new_tokens: int, with_smollm2: bool) -> list[dict]:
    """Export every layout as deci_hf with its reference: the jobs for headprune/export/vllm_client.py."""
    from test_clients import SMOL_TEXTS, TINY_TEXTS, export_case

    model, tokenizer = tiny_model()
    jobs = []
    for name, (mask, unit) in tiny_masks(model).items():
        jobs.append(export_case(model, tokenizer, name, mask, "deci_hf", "f32", out, TINY_TEXTS[:3], None, new_tokens, unit))
    if with_smollm2:
        model, tokenizer, mask = smollm2_case()
        jobs.append(export_case(model, tokenizer, "smollm2 joint", mask, "deci_hf", "f32", out, SMOL_TEXTS[:2], None, new_tokens, JOINT))
    return [{**job, "tolerance": LOGPROB_TOLERANCE} for job in jobs]


def vllm_rows(clients: Path, out: Path, new_tokens: int = 12, with_smollm2: bool = True) -> list[dict]:
    """Build the vLLM venv, the jobs, run the client; the check rows ([] with a message when the venv cannot be built)."""
    from client_env import ensure_vllm_env

    clients, out = clients.resolve(), out.resolve()
    python = ensure_vllm_env(clients)
    if python is None:
        print(f"vLLM's CPU build did not install in {clients / 'vllm-venv'} (see its .failed): the vLLM checks are skipped")
        return []
    out.mkdir(parents=True, exist_ok=True)
    jobs = vllm_jobs(out, new_tokens, with_smollm2)
    rows = []
    for index, job in enumerate(jobs):  # one process per directory: each vLLM engine starts and stops whole
        (out / f"job{index}.json").write_text(json.dumps([job]), encoding="utf-8")
        done = subprocess.run(
            [str(python), "-I", str(VLLM_CLIENT), str(out / f"job{index}.json")],
            cwd=out,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_NO_USAGE_STATS": "1"},
            capture_output=True,
            text=True,
        )
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []
        if done.returncode != 0 or any(row["passed"] is False for row in found):
            print(done.stderr[-4000:])
        rows += found or [
            {"client": "vLLM CPU", "file": job["name"], "check": "client ran", "passed": False, "detail": f"exit {done.returncode}"}
        ]
    for job in jobs:
        print(f"{job['name']}: (query heads, KV heads) per layer {job['layers']}, FFN widths {job['ffn_widths']}")
    return rows
