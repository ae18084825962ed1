"""Whole layers as the unit on every family of the table: gates, removal, generation, saving, gradients, FLOPs.

Every check compares two ways of computing the same thing on a tiny random model (fp32, 2-3 layers per stack).
"""

import json

import pytest
import torch
from conftest import tiny_bert
from test_ffn_units import HEADS_PRUNABLE, MODELS
from tiny_llms import lm_batch, tiny_family, tiny_llama

from headprune.core.ffn.pruning import ffn_record
from headprune.core.inputs import model_inputs
from headprune.core.kinds import KINDS
from headprune.core.layer.removal import REMOVED_ATTR, remove_layers
from headprune.core.pruning import prune_heads, pruning_record
from headprune.core.saving import load_pruned, save_pruned
from headprune.core.units import prune_unit_mask, unit_gates

PATTERNS = {  # which layers of every stack go, by position among its layers
    "first": lambda n: [0],
    "middle": lambda n: [n // 2] if n > 2 else None,
    "last": lambda n: [n - 1],
    "several": lambda n: [0, n - 1] if n > 2 else None,
}


def _logits(model, batch):
    with torch.no_grad():
        return model(**model_inputs(model, batch)).logits


def _close(actual, expected, rel=1e-5):
    """Equal within ``rel`` of the output scale."""
    torch.testing.assert_close(actual, expected, atol=rel * float(expected.abs().max()), rtol=0)


def _layer_mask(groups, pattern):
    """{group: [layers, 1]} removing the pattern's layers of every stack (None: the stacks are too short for it)."""
    mask = {}
    for group, (layers, _) in groups.items():
        gone = PATTERNS[pattern](layers)
        if gone is None:
            return None
        mask[group] = torch.ones(layers, 1)
        mask[group][gone] = 0
    return mask


def _unit_mask(model, unit, seed=0):
    """A head and neuron mask in ``unit``: random (about 70% kept), but the last query head of every KV group where KV heads are shared."""
    gates = unit_gates(model, unit)
    gen = torch.Generator().manual_seed(seed)
    mask = {g: (torch.rand(layers, units, generator=gen) < 0.7).float() for g, (layers, units) in gates.groups.items()}
    heads = unit_gates(model, "head")
    for group, per_kv in heads.heads_per_kv.items():
        if group in mask and per_kv > 1:
            mask[group] = torch.ones_like(mask[group])
            mask[group][:, per_kv - 1 :: per_kv] = 0  # as many query heads left for every KV head
    return mask


def _layer_indices(model):
    """[layer_idx of every module inside each layer] per layer stack, in stack order."""
    return [
        [m.layer_idx for m in site.module.modules() if isinstance(getattr(m, "layer_idx", None), int)]
        for site in unit_gates(model, "layer").sites
    ]


@pytest.mark.parametrize("name", MODELS)
def test_layer_mask_pruned_equals_masked(name):
    """First, middle, last and several layers of every stack: the pruned model's logits are the masked model's."""
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = unit_gates(model, "layer")
    plain = _logits(model, batch)
    for pattern in PATTERNS:
        mask = _layer_mask(gates.groups, pattern)
        if mask is None:
            continue
        with gates.masked(mask):
            masked = _logits(model, batch)
        assert (masked - plain).abs().max() > 1e-6, pattern  # the mask changes the output
        twin = make()
        records = prune_unit_mask(unit_gates(twin, "layer"), mask)
        _close(_logits(twin, batch), masked)
        gone = {g: (m[:, 0] == 0).nonzero().flatten().tolist() for g, m in mask.items()}
        assert records["layers"] == {g: {str(i): [0] for i in ids} for g, ids in gone.items()}
        assert getattr(twin.config, REMOVED_ATTR) == gone
        twin_gates = unit_gates(twin, "layer")
        assert twin_gates.groups == gates.groups  # masks stay by original layer id
        assert all(torch.equal(twin_gates.present()[g], m.bool()) for g, m in mask.items())


@pytest.mark.parametrize("name", MODELS)
def test_head_and_neuron_masks_by_original_layer_on_a_layer_pruned_model(name):
    """Head and FFN gates of a layer-pruned model take masks by original layer: they act as on the masked original."""
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    joint = unit_gates(model, ["head", "ffn", "layer"])
    layer_mask = _layer_mask(joint.parts[-1].groups, "last")
    twin = make()
    prune_unit_mask(unit_gates(twin, "layer"), layer_mask)
    units = unit_gates(twin, ["head", "ffn"])
    assert units.groups == unit_gates(model, ["head", "ffn"]).groups  # the removed last layer's rows are still there
    mask = _unit_mask(twin, ["head", "ffn"])
    with joint.masked({**mask, **layer_mask}):
        expected = _logits(model, batch)
    with units.masked(mask):
        _close(_logits(twin, batch), expected)


@pytest.mark.parametrize("name", [n for n in ("llama", "gpt2", "bert", "marian", "t5", "gemma2") if n in HEADS_PRUNABLE])
def test_heads_and_neurons_removed_after_layers_equal_the_joint_mask(name):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    joint = unit_gates(model, ["head", "ffn", "layer"])
    mask = {**_unit_mask(model, ["head", "ffn"]), **_layer_mask(joint.parts[-1].groups, "first")}
    with joint.masked(mask):
        expected = _logits(model, batch)
    twin = make()
    records = prune_unit_mask(unit_gates(twin, ["head", "ffn", "layer"]), mask)
    _close(_logits(twin, batch), expected)
    assert set(records) == {"heads", "ffn", "layers"} and records["heads"] == pruning_record(twin)
    assert all(int(layer) > 0 for layers in records["heads"].values() for layer in layers)  # by original id; layer 0 went whole


@pytest.mark.parametrize("name", ["llama", "gpt2", "opt", "gemma2", "falcon"])
def test_greedy_generation_with_cache_pruned_equals_gated(name):
    make, _ = MODELS[name]
    model, twin = make(), make()
    gates = unit_gates(model, "layer")
    mask = _layer_mask(gates.groups, "middle")
    prune_unit_mask(unit_gates(twin, "layer"), mask)
    assert all(set(ids) == {position} for position, ids in enumerate(_layer_indices(twin)) if ids)
    batch = lm_batch(left_pad=True)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=6, do_sample=False, pad_token_id=0)
    with gates.masked(mask):
        gated = model.generate(**kwargs)
    assert torch.equal(twin.generate(**kwargs), gated)


@pytest.mark.parametrize("stacks", ["enc_layer dec_layer", "enc_layer", "dec_layer"])
@pytest.mark.parametrize("name", ["marian", "t5"])
def test_seq2seq_generation_with_cache_pruned_equals_gated(name, stacks, tmp_path):
    """Beam search with a cache, whichever stack is the shallower (T5 sizes the cache by its decoder count), also stock-loaded."""
    make, make_batch = MODELS[name]
    model, twin = make(), make()
    gates = unit_gates(model, "layer")
    mask = {g: m if g in stacks.split() else torch.ones_like(m) for g, m in _layer_mask(gates.groups, "first").items()}
    prune_unit_mask(unit_gates(twin, "layer"), mask)
    batch = make_batch()
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5, do_sample=False, num_beams=2)
    with gates.masked(mask):
        gated = model.generate(**kwargs)
    assert torch.equal(twin.generate(**kwargs), gated)
    save_pruned(twin, tmp_path)
    assert torch.equal(type(twin).from_pretrained(tmp_path).eval().generate(**kwargs), gated)


@pytest.mark.parametrize("name", MODELS)
def test_save_load_round_trips_removed_layers(name, tmp_path):
    """Layers, heads and neurons removed: load_pruned rebuilds the shape by original id; a layers-only model loads stock."""
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    unit = ["head", "ffn"] if name in HEADS_PRUNABLE else ["ffn"]
    groups = unit_gates(model, "layer").groups
    layer_mask = _layer_mask(groups, "middle") or _layer_mask(groups, "last")
    prune_unit_mask(unit_gates(model, [*unit, "layer"]), {**_unit_mask(model, unit), **layer_mask})
    save_pruned(model, tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    record = json.loads((tmp_path / "pruned" / "headprune_pruning.json").read_text())
    gone = {g: (m[:, 0] == 0).nonzero().flatten().tolist() for g, m in layer_mask.items()}
    assert config[REMOVED_ATTR] == record["kinds"]["layer"]["removed_layers"] == gone
    loaded = load_pruned(tmp_path / "pruned")
    _close(_logits(loaded, batch), _logits(model, batch))
    assert pruning_record(loaded) == pruning_record(model) and ffn_record(loaded) == ffn_record(model)
    assert KINDS["layer"].record(loaded) == KINDS["layer"].record(model)
    assert unit_gates(loaded, ["head", "ffn", "layer"]).groups == unit_gates(model, ["head", "ffn", "layer"]).groups


@pytest.mark.parametrize("name", MODELS)
def test_a_layers_only_prune_loads_as_a_stock_model(name, tmp_path):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    prune_unit_mask(unit_gates(model, "layer"), _layer_mask(unit_gates(model, "layer").groups, "first"))
    save_pruned(model, tmp_path)
    stock = type(model).from_pretrained(tmp_path).eval()
    _close(_logits(stock, batch), _logits(model, batch))


def test_pruning_twice_by_original_id_equals_pruning_once():
    once, twice = tiny_llama(layers=5), tiny_llama(layers=5)
    remove_layers(once, {"dec_layer": [0, 2, 3]})
    remove_layers(twice, {"dec_layer": [2]})
    remove_layers(twice, {"dec_layer": [0, 2, 3]})  # 2 again: already gone
    _close(_logits(twice, lm_batch()), _logits(once, lm_batch()))
    assert twice.config.num_hidden_layers == 2 and twice.config.headprune_removed_layers == {"dec_layer": [0, 2, 3]}
    assert [layer.self_attn.layer_idx for layer in twice.model.layers] == [0, 1]


def test_layer_types_follow_the_kept_layers():
    model = tiny_family("gemma2", attn="eager")
    remove_layers(model, {"dec_layer": [1]})
    assert model.config.layer_types == ["sliding_attention", "sliding_attention"] and model.config.num_hidden_layers == 2


def test_layers_sharing_weights_are_refused():
    model = tiny_llama()
    model.model.layers[1].mlp.down_proj.weight = model.model.layers[0].mlp.down_proj.weight
    assert "share the weight mlp.down_proj.weight" in KINDS["layer"].available(model)
    with pytest.raises(ValueError, match="share the weight"):
        remove_layers(model, {"dec_layer": [1]})


def test_an_emptied_stack_and_inverse_layer_scaling_are_refused():
    with pytest.raises(ValueError, match="keep at least one layer per stack"):
        remove_layers(tiny_bert(), {"enc_layer": [0, 1, 2]})
    model = tiny_family("gpt2")
    model.config.scale_attn_by_inverse_layer_idx = True
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx"):
        remove_layers(model, {"dec_layer": [0]})
    remove_layers(model, {"dec_layer": [2]})  # the last layer: no kept layer is renumbered


def test_bad_layer_masks_name_what_was_wrong():
    model = tiny_llama()
    gates = unit_gates(model, "layer")
    with pytest.raises(ValueError, match=r"expected \[3, 1\]"):
        gates.set_mask({"dec_layer": torch.ones(3, 2)})
    with pytest.raises(ValueError, match="unknown layer group 'enc_layer'"):
        remove_layers(model, {"enc_layer": [0]})
    with pytest.raises(IndexError, match=r"layer ids \[3\] out of range"):
        remove_layers(model, {"dec_layer": [3]})
    with pytest.raises(ValueError, match="0 \\(remove the layer\\) or 1"):
        prune_unit_mask(gates, {"dec_layer": torch.full((3, 1), 0.5)})


def test_a_joint_unit_with_layers_is_one_mask_over_three_kinds():
    model = tiny_llama()
    joint = unit_gates(model, "head+ffn+layer")
    assert joint.unit == "head+ffn+layer" and set(joint.groups) == {"dec_self", "dec_ffn", "dec_layer"}
    assert KINDS["layer"].removed(KINDS["layer"].record(model)) == 0
    prune_heads(model, {"dec_self": {1: [0, 1]}})
    prune_unit_mask(joint, {"dec_layer": torch.tensor([[1.0], [0.0], [1.0]])})
    assert KINDS["layer"].removed(KINDS["layer"].record(model)) == 1 and pruning_record(model) == {}  # layer 1 took its heads along


def test_heads_removed_after_the_layers_by_original_id_and_a_deep_copy_gated_apart():
    import copy

    model, batch = tiny_llama(layers=4), lm_batch()
    joint = unit_gates(model, "head+layer")
    mask = {"dec_layer": torch.tensor([[0.0], [1.0], [0.0], [1.0]]), "dec_self": torch.ones(4, 4)}
    mask["dec_self"][3, [0, 1]] = 0
    with joint.masked(mask):
        expected = _logits(model, batch)
    twin = tiny_llama(layers=4)
    remove_layers(twin, {"dec_layer": [0, 2]})
    prune_heads(twin, {"dec_self": {3: [0, 1]}})  # original layer 3 is the second layer left
    _close(_logits(twin, batch), expected)
    copied = copy.deepcopy(twin)
    with unit_gates(twin, "layer").masked({"dec_layer": torch.zeros(4, 1)}):
        _close(_logits(copied, batch), expected)  # the original's gates leave the copy alone
