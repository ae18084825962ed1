"""``make test-clients``, vLLM: ``deci_hf`` exports run by vLLM's CPU build against the masked model.

A random 4-layer Llama with head size 32 (vLLM's CPU attention refuses head size 8, the tiny model's of
clients/cases.py), 4 query heads over 2 KV heads, tied embeddings, and the embedded SmolLM2-135M, pruned in these
layouts and exported as ``deci_hf``:

- ``joint``: uneven KV heads and FFN widths, an FFN emptied beside attention, the last layer emptied;
- ``heads``: a query-head mask with layer 0 emptied (vLLM's placeholder attention) and a query head padded back;
- ``ffn-only``: FFN widths alone (odd, uneven); ``kv-only``: one KV head in every layer;
- SmolLM2: 3 or 1 KV heads per layer (the counts that divide its 9 query heads), uneven FFN widths, layer 15 emptied;
- ``hidden``: the ``joint`` layouts with residual channels pruned too (``[kv_group, ffn, hidden]``): the tiny model keeps 90
  of its 128 channels, SmolLM2 its loudest 512 of 576, no multiple of their query heads; the head size stays (``head_dim``).
  vLLM's CPU build runs any width, but SmolLM2 with 500 channels (no multiple of 8) moved its log-probabilities by 6.5e-5
  and 1.3e-4 (two draws), against 2.8e-5 to 4.3e-5 with 496, 504, 512 or 576: a width vLLM's CPU kernels align to suits
  the 1e-4 check.

headprune/export/vllm_client.py runs each directory in ``.clients/vllm-venv`` (no headprune): greedy tokens equal, and their
log-probabilities within 1e-4 of the masked model's (float32 on both sides).
"""

from __future__ import annotations

import json
from pathlib import Path

from clients.cases import HIDDEN, JOINT, SMOL_TEXTS, TINY_TEXTS, export_case, joint_mask, kv_mask, load_smollm2, loudest_first, tiny_llama
from clients.env import ensure_vllm_env, run_client

VLLM_CLIENT = Path(__file__).resolve().parents[1] / "headprune" / "export" / "vllm_client.py"  # run as a file, without headprune
CLIENT_JOBS = VLLM_CLIENT.with_name("client_jobs.py")  # the script that runs it
LOGPROB_TOLERANCE = 1e-4  # float32 on both sides; measured differences about 1e-5


def tiny_model():
    """The head-size-32 Llama (hidden 128, tied embeddings) and its trained BPE tokenizer."""
    return tiny_llama(hidden_size=128, intermediate_size=96, head_dim=32, max_position_embeddings=128, tie_word_embeddings=True)


def tiny_masks(model) -> dict[str, tuple[dict, object]]:
    """{name: (mask, unit)} of the tiny model's layouts."""
    from headprune.core.attention.gates import HeadGates
    from headprune.core.units import unit_gates

    joint, hidden = unit_gates(model, JOINT), unit_gates(model, HIDDEN)
    removed, kept = {1: [0], 3: [0, 1]}, {0: 50, 1: 33, 2: 0, 3: 0}  # the last layer all gone
    masks = {
        "tiny32 joint": (joint_mask(joint, removed, kept), JOINT),
        "tiny32 ffn-only": (joint_mask(joint, {}, {0: 51, 1: 23, 2: 96, 3: 9}), JOINT),
        "tiny32 hidden": (joint_mask(hidden, removed, kept, 90), HIDDEN),
    }
    joint.remove()
    hidden.remove()
    heads = HeadGates(model)
    query = kv_mask(heads, {0: [0, 1]}, 2)  # layer 0 emptied: its FFN runs before any attention
    query["dec_self"][2, 3] = 0.0  # one query head of layer 2's second KV head: written back as a zero head
    masks["tiny32 heads"] = (query, "head")
    masks["tiny32 kv-only"] = (kv_mask(heads, {layer: [1] for layer in range(4)}, 2), "head")  # one KV head per layer
    heads.remove()
    return masks


def smollm2_masks(model, tokenizer) -> dict[str, tuple[dict, object]]:
    """{name: (mask, unit)} of SmolLM2's layouts vLLM takes (3 or 1 KV heads per layer; its loudest channels kept)."""
    from headprune.core.units import unit_gates

    removed = {layer: [1, 2] for layer in range(0, 30, 2)}  # even layers keep one KV head
    removed[15] = [0, 1, 2]
    widths = {**{layer: 1536 - 37 * layer for layer in range(30)}, 15: 0}
    joint, hidden = unit_gates(model, JOINT), unit_gates(model, HIDDEN)
    masks = {
        "smollm2 joint": (joint_mask(joint, removed, widths), JOINT),
        "smollm2 hidden": (joint_mask(hidden, removed, widths, 512, loudest_first(model, tokenizer, SMOL_TEXTS)), HIDDEN),
    }
    joint.remove()
    hidden.remove()
    return masks


def vllm_jobs(out: Path, new_tokens: int, with_smollm2: bool, keep=lambda name: True) -> list[dict]:
    """Export every layout whose name ``keep`` takes as deci_hf with its reference: the jobs for headprune/export/vllm_client.py."""
    model, tokenizer = tiny_model()
    jobs = []
    for name, (mask, unit) in tiny_masks(model).items():
        if keep(name):
            jobs.append(export_case(model, tokenizer, name, mask, "deci_hf", "f32", out, TINY_TEXTS[:3], None, new_tokens, unit))
    if with_smollm2:
        model, tokenizer, _ = load_smollm2()
        for name, (mask, unit) in smollm2_masks(model, tokenizer).items():
            if keep(name):
                jobs.append(export_case(model, tokenizer, name, mask, "deci_hf", "f32", out, SMOL_TEXTS[:2], None, new_tokens, unit))
    return [{**job, "tolerance": LOGPROB_TOLERANCE} for job in jobs]


def vllm_rows(clients: Path, out: Path, new_tokens: int = 12, with_smollm2: bool = True, keep=lambda name: True) -> list[dict]:
    """Build the vLLM venv, the jobs, run the client; the check rows ([] with a message when the venv cannot be built)."""
    clients, out = clients.resolve(), out.resolve()
    python = ensure_vllm_env(clients)
    if python is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    jobs = vllm_jobs(out, new_tokens, with_smollm2, keep)
    rows = []
    for index, job in enumerate(jobs):  # one process per directory: each vLLM engine starts and stops whole
        (out / f"job{index}.json").write_text(json.dumps([job]), encoding="utf-8")
        job_file = str(out / f"job{index}.json")
        done = run_client(python, CLIENT_JOBS, [str(VLLM_CLIENT), job_file], out, VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1")
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else []
        if done.returncode == 0 and any(row["passed"] is False for row in found):
            print(done.stderr[-4000:])
        rows += found or [
            {"client": "vLLM CPU", "file": job["name"], "check": "client ran", "passed": False, "detail": f"exit {done.returncode}"}
        ]
    for job in jobs:
        print(f"{job['name']}: (query heads, KV heads) per layer {job['layers']}, FFN widths {job['ffn_widths']}")
    return rows
