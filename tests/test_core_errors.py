"""Bad input gets an error that names the problem."""
import json

import pytest
import torch
from conftest import tiny_bert, tiny_marian

from headprune.heads import HeadGates
from headprune.pruning import prune_heads
from headprune.saving import load_pruned, save_pruned


def test_unsupported_family_lists_supported():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10))
    with pytest.raises(ValueError, match=r"does not support model type 'gpt2'.*bert.*marian"):
        HeadGates(model)


def test_mask_of_wrong_shape():
    gates = HeadGates(tiny_bert())
    with pytest.raises(ValueError, match=r"shape \(3, 5\); expected \[3, 4\]"):
        gates.set_mask(torch.ones(3, 5))
    with pytest.raises(ValueError, match="unknown attention group 'dec_self'"):
        gates.set_mask({"dec_self": torch.ones(3, 4)})
    marian_gates = HeadGates(tiny_marian())
    with pytest.raises(ValueError, match="several attention groups"):
        marian_gates.set_mask(torch.ones(2, 4))


def test_head_or_layer_out_of_range():
    model = tiny_bert()
    with pytest.raises(IndexError, match=r"head ids \[7\] out of range for enc_self layer 0 \(4 heads\)"):
        prune_heads(model, {"enc_self": {0: [7]}})
    with pytest.raises(IndexError, match=r"layer 9 out of range for group 'enc_self' \(3 layers\)"):
        prune_heads(model, {"enc_self": {9: [0]}})
    with pytest.raises(IndexError, match="no attention module for group 'enc_self' layer 5"):
        HeadGates(model).site("enc_self", 5)


def test_record_that_does_not_match_the_model(tmp_path):
    model = tiny_bert()
    prune_heads(model, {"enc_self": {1: [0, 1]}})
    save_pruned(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["headprune_pruned_heads"] = {"enc_self": {"1": [0]}}  # says fewer heads than the weights have
    (tmp_path / "config.json").write_text(json.dumps(config))
    meta = json.loads((tmp_path / "headprune_pruning.json").read_text())
    meta["pruned_heads"] = config["headprune_pruned_heads"]
    (tmp_path / "headprune_pruning.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not match its weights"):
        load_pruned(tmp_path)
    config["headprune_pruned_heads"] = {"enc_self": {"8": [0]}}
    meta["pruned_heads"] = config["headprune_pruned_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "headprune_pruning.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not match a bert model"):
        load_pruned(tmp_path)
