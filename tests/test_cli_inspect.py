"""The first user-facing command: `headprune experiment=inspect`."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def test_inspect_minilm_prints_structure_and_writes_results(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-m", "headprune.cli", "experiment=inspect", "model=minilm", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    out = result.stdout
    assert "enc_self" in out and "heads present: 72 of 72" in out
    assert "parameters: 22,714,371" in out and "attention:" in out
    payload = json.loads((tmp_path / "results.json").read_text())
    assert payload["schema_version"] == 2 and payload["results"]["groups"] == {"enc_self": [6, 12]}


@pytest.mark.parametrize(
    "model,model_type,kv", [("tiny_gpt2", "gpt2", None), ("tiny_pythia", "gpt_neox", None), ("tiny_gemma", "gemma2", "kv_heads/layer")]
)
def test_inspect_shows_the_tiny_decoder_families(tmp_path, capsys, model, model_type, kv):
    from experiment_helpers import compose_cfg
    from hydra.utils import get_method

    cfg = compose_cfg(tmp_path, ["experiment=inspect", f"model={model}", "data=lm_synthetic", "logger=none"])
    get_method(cfg.run)(cfg)
    out = capsys.readouterr().out
    assert f"model_type={model_type}" in out and "heads present: 8 of 8" in out
    assert (kv in out) if kv else "kv_heads" not in out


@pytest.mark.parametrize("model,tokens", [("tiny_vit", 17), ("tiny_deit", 18)])
def test_inspect_counts_an_image_model_at_its_own_tokens(tmp_path, capsys, model, tokens):
    """An image model's FLOPs are at its patches + CLS (+ DeiT's distillation token), the length of its hidden states."""
    import torch
    from experiment_helpers import compose_cfg
    from hydra.utils import get_method

    from headprune.core.counting import model_cost
    from headprune.tasks.registry import build_task_model

    cfg = compose_cfg(tmp_path, ["experiment=inspect", f"model={model}", "data=image_digits", "logger=none"])
    numbers = get_method(cfg.run)(cfg)
    out = capsys.readouterr().out
    assert f"at seq_len={tokens} (the model's own tokens per image: 16 patches + CLS" in out
    built = build_task_model(cfg.model, seed=int(cfg.seed)).eval()
    with torch.no_grad():
        hidden = built(pixel_values=torch.zeros(1, 3, 16, 16), output_hidden_states=True).hidden_states[0]
    assert numbers["cost"]["seq_len"] == hidden.shape[1] == tokens
    assert numbers["cost"]["flops"] == model_cost(built, seq_len=tokens).flops
