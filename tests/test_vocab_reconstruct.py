"""prune.recover=reconstruct with a joint unit holding vocab: the other kinds re-solved on the kept-token text."""

from __future__ import annotations

import copy

import pytest
import torch
from cli_runs import TINY_LM_PRUNE, headprune
from experiment_helpers import make_cfg


@pytest.fixture(scope="module")
def lm_task(tmp_path_factory):
    torch.set_num_threads(1)
    from headprune.tasks import registry

    return registry.load_task(make_cfg(tmp_path_factory.mktemp("task"), "prune", "lm", "data.tokenizer.vocab_size=400"))


def _mask(task):
    """A neuron half of layer 0, one KV group of layer 1 and the lower-ranked half of the removable tokens gone."""
    from omegaconf import OmegaConf

    from headprune.sources.orders import ORDERS, OrderSettings, with_floor

    mask = {g: torch.ones(layers, units) for g, (layers, units) in task.gates.groups.items()}
    mask["dec_ffn"][0, : mask["dec_ffn"].shape[1] // 2] = 0
    mask["dec_self"][1, 0] = 0  # a KV group
    importance = OmegaConf.create({"reduce": "example", "normalize_layers": False, "normalize_global": False})
    settings = OrderSettings(importance=importance, seed=0, ablation_split=None, n_samples=None)
    scores = with_floor(task, ORDERS["fisher"].scores(task, settings))["vocab"][0]
    removable = int(scores.isfinite().sum())
    mask["vocab"][0, scores.argsort(stable=True)[: removable // 2]] = 0  # merge-closed: the lowest ranks go first
    return mask


def test_reconstruct_with_vocab_equals_reconstruct_without_it_on_the_kept_token_text(lm_task):
    from headprune.core.units import prune_unit_mask, unit_gates
    from headprune.selection.reconstruct import reconstruct
    from headprune.stages.calibration_batches import kept_token_batches, recovery_batches
    from headprune.tasks.unit_task import in_unit

    task = in_unit(lm_task, "kv_group+ffn+vocab")
    mask = _mask(task)
    batches = recovery_batches(task, 16)
    with_vocab = copy.deepcopy(task.model)
    prune_unit_mask(unit_gates(with_vocab, task.gates.unit), mask)
    text = kept_token_batches(task, with_vocab, batches)
    removed = (mask["vocab"][0] == 0).nonzero().flatten()
    assert bool(torch.isin(torch.cat([b["input_ids"].flatten() for b in batches]), removed).any())  # the text used some
    assert not bool(torch.isin(torch.cat([b["input_ids"].flatten() for b in text]), removed).any())  # split again: none
    without = copy.deepcopy(task.model)
    prune_unit_mask(unit_gates(without, "kv_group+ffn"), {g: m for g, m in mask.items() if g != "vocab"})
    record = reconstruct(with_vocab, task.model, text)
    alone = reconstruct(without, task.model, text)
    assert record["projections"] == alone["projections"] > 0
    for name, after in record["error_after"].items():
        assert after < record["error_before"][name]  # re-solving lowers each projection's output error below the mask alone
        assert after == pytest.approx(alone["error_after"][name], rel=1e-4, abs=1e-9)
    ours, theirs = dict(with_vocab.named_modules()), dict(without.named_modules())
    for name in record["error_after"]:
        assert torch.allclose(ours[name].weight, theirs[name].weight, rtol=1e-4, atol=1e-6)


def test_joint_unit_with_vocab_reconstructs_and_vocab_alone_is_refused(capsys, monkeypatch, tmp_path):
    import json

    overrides = [*TINY_LM_PRUNE, "data.tokenizer.vocab_size=400", "prune.order=fisher", "prune.min_units_per_layer=1"]
    overrides += ["prune.fractions=[0.3]", "prune.recover=[none,reconstruct]"]
    joint = ["prune.unit=[kv_group,ffn,vocab]", "prune.joint_scale=loss"]
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "joint", *overrides, *joint)
    assert status == 0, err
    points = json.loads((tmp_path / "joint" / "results.json").read_text())["results"]["points"]
    rebuilt = [p for p in points if p.get("recovery") == "reconstruct"]
    assert rebuilt and rebuilt[0]["units_by_kind"]["vocab"]["removed"] > 0
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "alone", *overrides, "prune.unit=vocab")
    assert status == 2 and "no projection with fewer inputs" in err
