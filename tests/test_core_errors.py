"""Bad input gets an error that names the problem."""

import json

import pytest
import torch
from conftest import tiny_bert, tiny_marian

from headprune.core.attention.gates import HeadGates
from headprune.core.pruning import prune_heads
from headprune.core.saving import load_pruned, save_pruned


def test_unsupported_family_lists_supported():
    from transformers import BloomConfig, BloomForCausalLM

    model = BloomForCausalLM(BloomConfig(n_layer=1, n_head=2, hidden_size=8, vocab_size=10))
    with pytest.raises(ValueError, match=r"does not support model type 'bloom'.*bert.*marian"):
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
    with pytest.raises(IndexError, match="group 'enc_self' layer 5"):
        HeadGates(model).site("enc_self", 5)


def test_record_that_does_not_match_the_model(tmp_path):
    model = tiny_bert()
    prune_heads(model, {"enc_self": {1: [0, 1]}})
    save_pruned(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["headprune_pruned_heads"] = {"enc_self": {"1": [0]}}  # says fewer heads than the weights have
    (tmp_path / "config.json").write_text(json.dumps(config))
    meta = json.loads((tmp_path / "headprune_pruning.json").read_text())
    meta["kinds"]["head"]["pruned_heads"] = config["headprune_pruned_heads"]
    (tmp_path / "headprune_pruning.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not match its weights"):
        load_pruned(tmp_path)
    config["headprune_pruned_heads"] = {"enc_self": {"8": [0]}}
    meta["kinds"]["head"]["pruned_heads"] = config["headprune_pruned_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "headprune_pruning.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="does not match a bert model"):
        load_pruned(tmp_path)


def test_prune_mask_takes_a_bare_tensor_and_checks_its_shape():
    import numpy as np

    from headprune.core.pruning import prune_mask, pruning_record

    model = tiny_bert()  # 3 layers x 4 heads
    for wrong in (torch.zeros(2, 4), torch.zeros(3, 3), torch.zeros(4, 4)):
        with pytest.raises(ValueError, match=rf"shape \({wrong.shape[0]}, {wrong.shape[1]}\); expected \[3, 4\]"):
            prune_mask(model, wrong)
    with pytest.raises(ValueError, match="one \\[3, 4\\] mask per group"):
        prune_mask(model, torch.ones(2, 3, 4))
    assert pruning_record(model) == {}  # nothing was pruned by the rejected masks
    mask = torch.ones(3, 4)
    mask[1, 2] = 0
    assert prune_mask(model, mask) == {"enc_self": {"1": [2]}}
    assert prune_mask(model, np.ones((3, 4))) == {"enc_self": {"1": [2]}}


@pytest.mark.parametrize(
    "value,message", [(0.5, "0.5 at layer 2, head 1"), (float("nan"), "NaN at layer 2, head 1"), (float("inf"), "inf at layer 2, head 1")]
)
def test_hard_masks_must_be_zero_or_one(value, message):
    from headprune.core.pruning import prune_mask

    mask = torch.ones(3, 4)
    mask[2, 1] = value
    with pytest.raises(ValueError, match=rf"group 'enc_self' has {message}.*expected 0 \(remove the head\) or 1"):
        prune_mask(tiny_bert(), {"enc_self": mask})


def test_soft_gates_are_allowed_but_not_nan_or_inf():
    gates = HeadGates(tiny_bert())
    soft = torch.full((3, 4), 0.5)
    gates.set_mask(soft)  # soft gates in [0, 1] (and beyond) are fine for set_mask
    for value in (float("nan"), float("-inf")):
        bad = soft.clone()
        bad[0, 3] = value
        with pytest.raises(ValueError, match=r"at layer 0, head 3 .*expected finite gate values"):
            gates.set_mask(bad)
    batched = torch.ones(2, 3, 4)
    batched[1, 2, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN at example 1, layer 2, head 0"):
        gates.set_mask(batched)


def test_head_and_layer_ids_must_be_integers():
    import numpy as np

    from headprune.core.pruning import pruning_record

    model = tiny_bert()
    with pytest.raises(ValueError, match=r"head id for enc_self layer 0 must be an integer, got 1.7"):
        prune_heads(model, {"enc_self": {0: [1.7]}})
    with pytest.raises(ValueError, match=r"layer id for group 'enc_self' must be an integer, got 0.5"):
        prune_heads(model, {"enc_self": {0.5: [1]}})
    assert pruning_record(model) == {}
    prune_heads(model, {"enc_self": {np.int64(1): [2.0, np.int32(3), torch.tensor(0)], "2": [1]}})
    assert pruning_record(model) == {"enc_self": {"1": [0, 2, 3], "2": [1]}}
