"""A deci GGUF whose last layer lost every head and neuron runs in llama.cpp (where ``make test-clients`` built it) and
equals the masked model: logits, greedy tokens and the per-layer counts deci needs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
TOOLS = ROOT / "tools"
CLIENTS_PYTHON = ROOT / ".clients" / "venv" / "bin" / "python"
BUILT = any((ROOT / ".clients" / "venv").glob("lib/*/site-packages/llama_cpp"))

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not BUILT, reason="llama.cpp is not built: make test-clients builds it into .clients/venv"),
]


def test_an_emptied_last_layer_runs_in_llama_cpp_and_equals_the_masked_model(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(TOOLS))
    from test_clients import JOINT, TINY_TEXTS, TRAINED_PRE, expected_deci_layout, export_case, joint_mask
    from transformers import LlamaConfig, LlamaForCausalLM

    from headprune.core.units import unit_gates
    from headprune.models.tokenizers import train_tokenizer

    tokenizer = train_tokenizer(TINY_TEXTS * 5, vocab_size=300)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=64, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    joint = unit_gates(model, JOINT)
    mask = joint_mask(joint, {1: [0], 3: [0, 1]}, {0: 40, 3: 0})  # layer 3: every KV group and every neuron gone
    joint.remove()
    job = export_case(model, tokenizer, "last-emptied", mask, "gguf", "f32", tmp_path, TINY_TEXTS[:3], TRAINED_PRE, 8, JOINT)
    assert job["file_layout"] == expected_deci_layout(job["layers"], job["ffn_widths"])
    assert job["file_layout"]["feed_forward_length"][-1] == 1 and job["file_layout"]["head_count"][-1] == 0
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    done = subprocess.run(
        [str(CLIENTS_PYTHON), "-I", str(TOOLS / "clients_check.py"), str(tmp_path / "jobs.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    failed = [row for row in rows if row["passed"] is False]
    assert not failed and any(row["check"] == "logits (f32 KV cache)" and row["passed"] for row in rows), rows
