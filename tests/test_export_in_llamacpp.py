"""Deci GGUF files run in llama.cpp (where ``make test-clients`` built it) and equal the masked model: logits, greedy tokens
and the per-layer counts deci needs; one whose last layer lost every head and neuron, and one whose residual stream
keeps 21 of its 32 channels (no multiple of the heads; the head size stays 8)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from experiment_helpers import built_clients

ROOT = Path(__file__).resolve().parents[1]
CLIENTS = built_clients()
CLIENTS_PYTHON = CLIENTS / "venv" / "bin" / "python" if CLIENTS else None

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CLIENTS is None, reason="llama.cpp is not built: make test-clients builds it into .clients/venv"),
]

CASES = {  # name: (unit, KV groups removed {layer: [ids]}, FFN neurons kept {layer: count}, residual channels kept)
    "last-emptied": (["kv_group", "ffn"], {1: [0], 3: [0, 1]}, {0: 40, 3: 0}, None),  # layer 3: every KV group and neuron gone
    "hidden": (["kv_group", "ffn", "hidden"], {1: [0], 3: [1]}, {0: 40, 2: 17}, 21),
}


def _llama_cpp_rows(job: dict, folder: Path) -> list[dict]:
    """The rows of clients/clients_check.py for one job, run in the clients' venv."""
    (folder / "jobs.json").write_text(json.dumps([job]))
    done = subprocess.run(
        [str(CLIENTS_PYTHON), "-I", str(ROOT / "clients" / "clients_check.py"), str(folder / "jobs.json")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", list(CASES))
def test_a_deci_file_runs_in_llama_cpp_and_equals_the_masked_model(case, tmp_path, monkeypatch):
    from clients.cases import TINY_TEXTS, TRAINED_PRE, expected_deci_layout, export_case, joint_mask, tiny_llama
    from headprune.core.units import unit_gates

    unit, removed, kept, channels = CASES[case]
    model, tokenizer = tiny_llama()
    joint = unit_gates(model, unit)
    mask = joint_mask(joint, removed, kept, channels)
    joint.remove()
    job = export_case(model, tokenizer, case, mask, "gguf", "f32", tmp_path, TINY_TEXTS[:3], TRAINED_PRE, 8, unit)
    assert job["file_layout"] == expected_deci_layout(job["layers"], job["ffn_widths"])
    if channels is None:
        assert job["file_layout"]["feed_forward_length"][-1] == 1 and job["file_layout"]["head_count"][-1] == 0
    rows = _llama_cpp_rows(job, tmp_path)
    failed = [row for row in rows if row["passed"] is False]
    assert not failed and any(row["check"] == "logits (f32 KV cache)" and row["passed"] for row in rows), rows
