"""save_pruned / load_pruned go through the kinds: each writes its entries under its name, and older records still load."""

import json

import pytest
import torch
from tiny_llms import lm_batch, tiny_llama

from headprune.core.kinds import KINDS
from headprune.core.saving import RECORD_FILE, load_pruned, save_pruned, saving_kinds
from headprune.core.units import prune_unit_mask, unit_gates

UNIT = ["head", "ffn", "layer", "hidden"]


def _logits(model, batch):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def _pruned_in_every_kind():
    """A tiny Llama with a layer, heads, neurons and residual channels removed."""
    model = tiny_llama()
    gates = unit_gates(model, UNIT)
    mask = {g: torch.ones(shape) for g, shape in gates.groups.items()}
    mask["dec_layer"][1, 0] = 0
    mask["dec_self"][0, 1] = mask["dec_self"][2, :2] = 0
    mask["dec_ffn"][0, :20] = mask["dec_ffn"][2, 5:9] = 0
    mask["hidden"][0, 4:12] = 0  # 24 of 32 channels: a multiple of the 4 heads Llama's config asks for
    prune_unit_mask(gates, mask)
    return model


def _as_format_1(path):
    """Rewrite a record as save_pruned wrote it before the kinds saved themselves: every entry at the top level."""
    meta = json.loads((path / RECORD_FILE).read_text())
    flat = {"model_type": meta["model_type"], "architecture": meta["architecture"]}
    for entries in meta["kinds"].values():
        flat.update(entries)
    (path / RECORD_FILE).write_text(json.dumps(flat))


def test_each_kind_writes_its_entries_under_its_name(tmp_path):
    model = _pruned_in_every_kind()
    save_pruned(model, tmp_path)
    meta = json.loads((tmp_path / RECORD_FILE).read_text())
    assert meta["format"] == 2 and set(meta["kinds"]) == {"head", "ffn", "layer", "hidden"}
    assert meta["kinds"]["layer"] == {"removed_layers": {"dec_layer": [1]}}
    assert meta["kinds"]["head"]["pruned_heads"] == {"dec_self": {"0": [1], "2": [0, 1]}}
    assert [kind.name for kind in saving_kinds()][:4] == ["layer", "head", "kv_group", "ffn"]  # depth before widths


@pytest.mark.parametrize("layout", ["format 2", "format 1"])
def test_a_model_pruned_in_every_kind_loads_from_either_format(layout, tmp_path):
    model, batch = _pruned_in_every_kind(), lm_batch()
    save_pruned(model, tmp_path)
    if layout == "format 1":
        _as_format_1(tmp_path)
    loaded = load_pruned(tmp_path)
    for name in UNIT:
        assert KINDS[name].record(loaded) == KINDS[name].record(model), name
    expected = _logits(model, batch)
    assert (_logits(loaded, batch) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_a_format_1_record_still_checks_its_digests(tmp_path):
    save_pruned(_pruned_in_every_kind(), tmp_path)
    _as_format_1(tmp_path)
    meta = json.loads((tmp_path / RECORD_FILE).read_text())
    meta["pruned_neurons"]["dec_ffn"]["2"] = [5, 6, 7, 10]  # the same width, another neuron
    (tmp_path / RECORD_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="feed-forward block dec_ffn.2 .* another SHA-256"):
        load_pruned(tmp_path)


def test_a_record_of_a_kind_not_registered_is_refused(tmp_path):
    save_pruned(tiny_llama(), tmp_path)
    meta = json.loads((tmp_path / RECORD_FILE).read_text())
    meta["kinds"]["lowrank"] = {"ranks": {}}
    (tmp_path / RECORD_FILE).write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"kinds \['lowrank'\], which are not registered: register them"):
        load_pruned(tmp_path)
