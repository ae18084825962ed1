"""Least-squares recovery: identity when nothing is pruned, masked and pruned twins agree, it survives save/load."""

import copy
import subprocess
import sys
import textwrap

import torch
from conftest import classifier_batch, seq2seq_batch, tiny_bert, tiny_marian

from headprune.core.gates import HeadGates
from headprune.core.pruning import prune_mask
from headprune.core.saving import load_pruned, save_pruned
from headprune.selection.lsq import layer_output_errors, lsq_recover


def _logits(model, batch):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def _mask(gates):
    mask = gates.ones()
    mask["enc_self"][0, [0, 2]] = 0
    mask["enc_self"][1, 1] = 0
    mask["enc_self"][2, [0, 1, 3]] = 0
    return mask


BATCHES = [classifier_batch(seed=s, batch=8, length=12) for s in range(3)]


def _pruned_with_teacher(model, last_layer_too: bool = False):
    """(teacher copy, gates) after removing the first two heads of layer 1 of every group (and head 2 of the last layer)."""
    teacher = copy.deepcopy(model)
    gates = HeadGates(model)
    mask = {g: torch.ones(layers, heads) for g, (layers, heads) in gates.groups.items()}
    for group in mask:
        mask[group][0, :2] = 0
        if last_layer_too:
            mask[group][-1, 1] = 0
    prune_mask(model, mask)
    return teacher, gates


def test_keeping_every_head_is_the_identity():
    model = tiny_bert()
    before = _logits(model, BATCHES[0])
    scales = lsq_recover(model, HeadGates(model), BATCHES)
    torch.testing.assert_close(scales["enc_self"], torch.ones(3, 4), atol=1e-5, rtol=0)
    torch.testing.assert_close(_logits(model, BATCHES[0]), before, atol=1e-5, rtol=0)


def test_masked_twin_and_pruned_twin_agree_and_give_the_same_scales():
    model = tiny_bert()
    gates = HeadGates(model)
    mask = _mask(gates)
    teacher = copy.deepcopy(model)
    pruned = copy.deepcopy(model)
    prune_mask(pruned, mask)
    masked_scales = lsq_recover(model, gates, BATCHES, mask=mask)
    pruned_scales = lsq_recover(pruned, HeadGates(pruned), BATCHES, teacher=teacher)
    torch.testing.assert_close(masked_scales["enc_self"], pruned_scales["enc_self"], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(masked_scales["enc_self"], torch.ones(3, 4))
    with gates.masked(mask):
        masked = _logits(model, BATCHES[1])
    torch.testing.assert_close(_logits(pruned, BATCHES[1]), masked, atol=1e-5, rtol=0)
    twin = copy.deepcopy(model)
    HeadGates(twin).set_mask(None)
    prune_mask(twin, mask)  # the scales folded into the masked model survive physical pruning
    torch.testing.assert_close(_logits(twin, BATCHES[1]), masked, atol=1e-5, rtol=0)


def test_cached_teacher_targets_give_the_scales_of_a_teacher_run_per_layer():
    for make, batches in ((tiny_bert, BATCHES), (tiny_marian, [seq2seq_batch(seed=s) for s in range(2)])):
        model = make()
        teacher, gates = _pruned_with_teacher(model, last_layer_too=True)
        twin = copy.deepcopy(model)
        cached = lsq_recover(model, gates, batches, teacher=teacher)
        per_layer = lsq_recover(twin, HeadGates(twin), batches, teacher=teacher, max_cache_bytes=0)
        for group in cached:
            torch.testing.assert_close(cached[group], per_layer[group], atol=1e-5, rtol=1e-5)


def test_recovery_lowers_the_layer_output_error():
    model = tiny_bert(seed=1)
    teacher = copy.deepcopy(model)
    gates = HeadGates(model)
    mask = _mask(gates)
    prune_mask(model, mask)
    held_out = [classifier_batch(seed=10 + s, batch=8, length=12) for s in range(2)]
    before = layer_output_errors(model, gates, teacher, held_out)["enc_self"]
    lsq_recover(model, gates, BATCHES, teacher=teacher)
    after = layer_output_errors(model, gates, teacher, held_out)["enc_self"]
    assert after[0] < before[0]  # the first layer sees the same inputs: least squares can only help
    assert after.sum() < before.sum()


def test_seq2seq_recovery_runs_every_group_and_lowers_the_error():
    model = tiny_marian()
    teacher, gates = _pruned_with_teacher(model)
    batches = [seq2seq_batch(seed=s) for s in range(3)]
    before = layer_output_errors(model, gates, teacher, batches)
    scales = lsq_recover(model, gates, batches, teacher=teacher)
    after = layer_output_errors(model, gates, teacher, batches)
    assert set(scales) == {"enc_self", "enc_dec", "dec_self"}
    assert sum(float(a.sum()) for a in after.values()) < sum(float(b.sum()) for b in before.values())


def test_recovered_model_saves_and_loads_in_a_fresh_process(tmp_path):
    model = tiny_bert()
    teacher = copy.deepcopy(model)
    gates = HeadGates(model)
    prune_mask(model, _mask(gates))
    lsq_recover(model, gates, BATCHES, teacher=teacher)
    gates.remove()
    save_pruned(model, tmp_path / "model")
    torch.save(BATCHES[1], tmp_path / "batch.pt")
    script = textwrap.dedent(f"""
        import torch
        from headprune.core.saving import load_pruned
        model = load_pruned({str(tmp_path / "model")!r})
        batch = torch.load({str(tmp_path / "batch.pt")!r})
        with torch.no_grad():
            logits = model(**{{k: v for k, v in batch.items() if k != 'labels'}}).logits
        torch.save(logits, {str(tmp_path / "logits.pt")!r})
    """)
    subprocess.run([sys.executable, "-c", script], check=True)
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), _logits(model, BATCHES[1]), atol=1e-5, rtol=0)
    torch.testing.assert_close(_logits(load_pruned(tmp_path / "model"), BATCHES[1]), _logits(model, BATCHES[1]), atol=1e-5, rtol=0)


def test_a_pruned_model_without_teacher_is_a_clear_error():
    import pytest

    model = tiny_bert()
    prune_mask(model, _mask(HeadGates(model)))
    with pytest.raises(ValueError, match="teacher"):
        lsq_recover(model, HeadGates(model), BATCHES)
