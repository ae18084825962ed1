"""A kind with weights of its own (tests/kind_lowrank_plugin.py) prunes, saves, loads, times and exports to ONNX unchanged."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from kind_lowrank_plugin import LowRankKind, attach_lowrank, branches
from tiny_llms import causal_lm_loss, lm_batch, tiny_llama

from headprune.core.kinds import register_kind, unregister_kind
from headprune.core.saving import RECORD_FILE, load_pruned, save_pruned
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.scoring.importance import per_example_gate_gradients

RANK = 4
MASK = {"dec_ffn_lowrank": torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])}  # layer 1 emptied


@pytest.fixture
def lowrank():
    register_kind(LowRankKind())
    yield
    unregister_kind("lowrank")


def _logits(model, batch):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def _close(actual, expected):
    assert (actual - expected).abs().max() <= 1e-5 * expected.abs().max()


def _pruned():
    """A tiny Llama with rank-4 branches, and it with the components of ``MASK`` removed."""
    model = attach_lowrank(tiny_llama(), RANK)
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "lowrank"), MASK)
    return model, pruned


def test_the_branch_changes_the_model_and_its_hard_mask_equals_pruning(lowrank):
    model, pruned = _pruned()
    batch = lm_batch()
    assert (_logits(model, batch) - _logits(tiny_llama(), batch)).abs().max() > 1e-3  # the branches act
    with unit_gates(model, "lowrank").masked(MASK):
        masked = _logits(model, batch)
    _close(_logits(pruned, batch), masked)
    assert [b.rank_ids for b in branches(pruned)] == [[0, 2], [], [0, 1, 2]]
    assert [b.a.out_features for b in branches(pruned)] == [2, 1, 3]  # the emptied branch keeps one zero phantom


def test_probe_gradients_equal_autograd_through_the_gates(lowrank):
    model, batch = attach_lowrank(tiny_llama(), RANK), lm_batch()
    gates = unit_gates(model, "lowrank")
    probes = per_example_gate_gradients(model, gates, batch, loss_fn=causal_lm_loss, unit="lowrank")["dec_ffn_lowrank"]  # (B, L, R)
    mask = torch.ones(3, RANK, requires_grad=True)
    with gates.masked({"dec_ffn_lowrank": mask}):
        causal_lm_loss(model(**{k: v for k, v in batch.items() if k != "labels"}), batch).sum().backward()
    expected = mask.grad
    torch.testing.assert_close(probes.sum(0).float(), expected, atol=1e-5 * float(expected.abs().max()), rtol=0)


def test_save_and_load_rebuild_the_branches(lowrank, tmp_path):
    _, pruned = _pruned()
    batch = lm_batch()
    save_pruned(pruned, tmp_path)
    meta = json.loads((tmp_path / RECORD_FILE).read_text())["kinds"]["lowrank"]
    assert meta == {"rank": RANK, "kept": {"dec_ffn_lowrank": {"0": [0, 2], "1": [], "2": [0, 1, 2]}}}
    loaded = load_pruned(tmp_path)
    assert [b.rank_ids for b in branches(loaded)] == [[0, 2], [], [0, 1, 2]]
    _close(_logits(loaded, batch), _logits(pruned, batch))
    assert unit_gates(loaded, "lowrank").present()["dec_ffn_lowrank"].equal(MASK["dec_ffn_lowrank"].bool())


def test_a_saved_branch_needs_its_kind_registered(lowrank, tmp_path):
    _, pruned = _pruned()
    save_pruned(pruned, tmp_path)
    unregister_kind("lowrank")
    with pytest.raises(ValueError, match=r"kinds \['lowrank'\], which are not registered"):
        load_pruned(tmp_path)


def test_a_loaded_branch_model_is_timed_and_exported_to_onnx(lowrank, tmp_path):
    import numpy as np
    import onnxruntime

    from headprune.engine.timing import compare_throughput
    from headprune.export.onnx import export_onnx

    original, pruned = _pruned()
    save_pruned(pruned, tmp_path / "saved")
    loaded = load_pruned(tmp_path / "saved")
    batch = {k: v for k, v in lm_batch().items() if k != "labels"}
    calls = {"original": lambda b: original(**b), "pruned": lambda b: loaded(**b)}
    timing = compare_throughput(calls, [batch], warmup=0, repeats=1)
    assert timing["pruned"]["examples_per_s"] > 0 and timing["original"]["examples_per_s"] > 0
    graph = export_onnx(loaded, batch, tmp_path / "onnx")["model"]
    session = onnxruntime.InferenceSession(str(graph))
    names = [i.name for i in session.get_inputs()]
    (logits,) = session.run(None, {name: batch[name].numpy() for name in names})
    _close(torch.from_numpy(np.asarray(logits)), _logits(pruned, batch))


def _saved_branch_model(path):
    """A tiny Llama as conf/model/tiny_llama.yaml draws it, with rank-4 branches, saved with a tokenizer for model.pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from headprune.models.tokenizers import special_ids, train_tokenizer

    tokenizer = train_tokenizer([f"a small text number {i} about the branch" for i in range(50)], vocab_size=200)
    ids = {k: v for k, v in special_ids(tokenizer).items() if k in ("pad_token_id", "eos_token_id", "bos_token_id")}
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, max_position_embeddings=128, **ids,
    )  # fmt: skip
    save_pruned(attach_lowrank(LlamaForCausalLM(config).eval(), RANK), path, tokenizer=tokenizer)
    return path


def test_an_outside_kind_with_weights_runs_prune_speed_and_onnx_export(lowrank, capsys, monkeypatch, tmp_path):
    from cli_runs import TINY_LM_PRUNE, headprune

    saved = _saved_branch_model(tmp_path / "branches")
    model = [f"model.pretrained={saved}", f"model.tokenizer={saved}"]
    run = tmp_path / "prune"
    status, err = headprune(
        capsys, monkeypatch, tmp_path, run, *TINY_LM_PRUNE, *model, "prune.unit=lowrank", "prune.order=fisher", "prune.fractions=[0.5]"
    )
    assert status == 0, err
    results = json.loads((run / "results.json").read_text())
    steps = results["results"]["orders"]["fisher"]["steps"]
    assert results["results"]["unit"] == "lowrank" and set(steps[-1]["mask"]) == {"dec_ffn_lowrank"}
    base = [o for o in TINY_LM_PRUNE if o != "experiment=prune"] + model
    speed = tmp_path / "speed"
    timing = ["speed.batch_sizes=[2]", "speed.repeats=2", "speed.max_repeats=2", "speed.warmup=0"]
    status, err = headprune(capsys, monkeypatch, tmp_path, speed, *base, "experiment=speed", f"speed.mask_file={run}/results.json", *timing)
    assert status == 0, err
    cost = json.loads((speed / "results.json").read_text())["results"]["cost"]
    removed = sum(1 - v for row in steps[-1]["mask"]["dec_ffn_lowrank"] for v in row)
    assert cost["original"]["parameters"] - cost["pruned"]["parameters"] == removed * (64 + 32)  # a row of a, a column of b
    export = tmp_path / "export"
    status, err = headprune(
        capsys, monkeypatch, tmp_path, export, *base, "experiment=export", "export.format=onnx", f"export.mask_file={run}/results.json"
    )
    assert status == 0, err
    import onnx

    (graph,) = export.rglob("*.onnx")
    branch_shapes = sorted(tuple(w.dims) for w in onnx.load(graph).graph.initializer if 0 < min(w.dims, default=0) < RANK)
    kept = [int(sum(row)) for row in steps[-1]["mask"]["dec_ffn_lowrank"]]
    assert branch_shapes == sorted([(64, k) for k in kept] + [(k, 32) for k in kept])  # the exported branches: the kept rank
