"""Saved pruned models: transformers v4's pruned_heads layout in both directions, and the weights digest."""

import json

import pytest
import torch
from conftest import classifier_batch, encoder_logits, tiny_bert, tiny_marian
from safetensors.torch import load_file, save_file

from headprune.core.attention.gates import HeadGates
from headprune.core.pruning import prune_heads, prune_mask
from headprune.core.saving import RECORD_FILE, load_pruned, save_pruned

V4_PRUNED = {"0": [0, 2], "1": [3], "2": [0, 1, 2, 3]}  # layer 2 loses every head


def _v4_slice(state, pruned_heads, heads=4, head_dim=8):
    """transformers v4's prune_linear_layer on a full BERT state dict: keep the other heads' rows/columns."""
    state = dict(state)
    for layer, removed in pruned_heads.items():
        keep = [h for h in range(heads) if h not in removed]
        rows = torch.tensor([h * head_dim + d for h in keep for d in range(head_dim)], dtype=torch.long)
        prefix = f"bert.encoder.layer.{layer}.attention."
        for name in ("self.query", "self.key", "self.value"):
            state[prefix + name + ".weight"] = state[prefix + name + ".weight"][rows].contiguous()
            state[prefix + name + ".bias"] = state[prefix + name + ".bias"][rows].contiguous()
        state[prefix + "output.dense.weight"] = state[prefix + "output.dense.weight"][:, rows].contiguous()
    return state


def _mask_of(pruned_heads):
    mask = torch.ones(3, 4)
    for layer, removed in pruned_heads.items():
        mask[int(layer), removed] = 0
    return mask


def test_load_a_directory_pruned_by_transformers_v4(tmp_path):
    model = tiny_bert()
    batch = classifier_batch()
    gates = HeadGates(model)
    with gates.masked(_mask_of(V4_PRUNED)):
        masked = encoder_logits(model, batch)
    gates.remove()
    model.save_pretrained(tmp_path)  # the full model, then rewritten in v4's pruned layout
    state = load_file(str(tmp_path / "model.safetensors"))
    save_file(_v4_slice(state, V4_PRUNED), str(tmp_path / "model.safetensors"))
    config = json.loads((tmp_path / "config.json").read_text())
    config["pruned_heads"] = V4_PRUNED
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded = load_pruned(tmp_path)
    assert loaded.config.headprune_pruned_heads == {"enc_self": V4_PRUNED}
    torch.testing.assert_close(encoder_logits(loaded, batch), masked, atol=1e-5, rtol=0)


def test_saved_directory_has_v4_pruned_heads_and_v4_weights(tmp_path):
    model = tiny_bert()
    full_state = {k: v.clone() for k, v in model.state_dict().items()}
    pruned = {layer: ids for layer, ids in V4_PRUNED.items() if len(ids) < 4}  # v4 has no phantom head for empty layers
    prune_heads(model, {"enc_self": pruned})
    save_pruned(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["pruned_heads"] == pruned
    saved = load_file(str(tmp_path / "model.safetensors"))
    v4 = _v4_slice(full_state, pruned)
    for key, value in saved.items():
        torch.testing.assert_close(value, v4[key], atol=0, rtol=0)


def test_seq2seq_families_write_no_v4_pruned_heads(tmp_path):
    model = tiny_marian()
    prune_heads(model, {"enc_dec": {0: [1]}})
    save_pruned(model, tmp_path)
    assert "pruned_heads" not in json.loads((tmp_path / "config.json").read_text())


def _edit_record(path, record):
    config = json.loads((path / "config.json").read_text())
    config["headprune_pruned_heads"] = record
    config["pruned_heads"] = record["enc_self"]
    (path / "config.json").write_text(json.dumps(config))
    meta = json.loads((path / RECORD_FILE).read_text())
    meta["kinds"]["head"]["pruned_heads"] = record
    (path / RECORD_FILE).write_text(json.dumps(meta))
    return meta


def test_record_naming_other_heads_with_the_same_counts_fails_to_load(tmp_path):
    model = tiny_bert()
    prune_mask(model, _mask_of({"1": [0, 1]}))
    save_pruned(model, tmp_path)
    load_pruned(tmp_path)  # untouched: loads
    _edit_record(tmp_path, {"enc_self": {"1": [2, 3]}})  # the same head count, other heads
    with pytest.raises(ValueError, match=r"attention module enc_self\.1 \(kept heads \[0, 1\]\) has another SHA-256"):
        load_pruned(tmp_path)


def test_directory_without_digest_still_loads(tmp_path):
    model = tiny_bert()
    batch = classifier_batch()
    prune_heads(model, {"enc_self": {1: [0, 1]}})
    save_pruned(model, tmp_path)
    meta = json.loads((tmp_path / RECORD_FILE).read_text())
    del meta["kinds"]["head"]["weights_sha256"]
    (tmp_path / RECORD_FILE).write_text(json.dumps(meta))
    torch.testing.assert_close(encoder_logits(load_pruned(tmp_path), batch), encoder_logits(model, batch), atol=1e-6, rtol=0)
