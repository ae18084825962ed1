"""FFN neurons on every family of the table: gates, per-example gates, pruning, joint head + neuron masks, importance, saving, FLOPs.

Every check compares two ways of computing the same thing on a tiny random model (fp32, 2-3 layers).
"""

import copy
import json
from dataclasses import replace

import pytest
import torch
from conftest import classifier_batch, seq2seq_batch, tiny_bart, tiny_bert, tiny_marian, tiny_roberta
from tiny_encoders import FAMILY_MODELS
from tiny_llms import DECODER_CONFIGS, lm_batch, tiny_decoder, tiny_family, tiny_llama, tiny_qwen2
from torch.utils.flop_counter import FlopCounterMode

from headprune.core import families
from headprune.core.attention.gates import HeadGates
from headprune.core.counting import model_cost, neuron_flops
from headprune.core.families import FAMILIES, family_for
from headprune.core.ffn.gates import FFNGates
from headprune.core.ffn.pruning import ffn_record, prune_ffn_mask, prune_neurons
from headprune.core.inputs import model_inputs
from headprune.core.pruning import pruning_record
from headprune.core.saving import load_pruned, save_pruned
from headprune.core.units import prune_joint_mask, unit_gates
from headprune.scoring.importance import importance_scores, per_example_gate_gradients, per_example_loss


def _decoder(model_type):
    return lambda: tiny_family(model_type, attn="eager" if model_type == "gemma2" else "sdpa")


MODELS = {  # name: (tiny model, its batch); at least one per family of the table
    "bert": (tiny_bert, classifier_batch),
    "roberta": (tiny_roberta, classifier_batch),
    "marian": (tiny_marian, seq2seq_batch),
    "bart": (tiny_bart, seq2seq_batch),
    "llama": (tiny_llama, lm_batch),
    "qwen2": (tiny_qwen2, lm_batch),
    "mistral": (lambda: tiny_decoder("mistral"), lm_batch),
    **{t: (_decoder(t), lm_batch) for t in DECODER_CONFIGS},
    **{n: FAMILY_MODELS[n] for n in ("distilbert", "vit", "deit", "t5", "mt5", "whisper", "deberta-v2")},
}
HEADS_PRUNABLE = [n for n in MODELS if n != "olmo2"]  # OLMo 2 normalises across heads: its heads are gated, never pruned


def _logits(model, batch):
    with torch.no_grad():
        return model(**model_inputs(model, batch)).logits


def _close(actual, expected, rel=1e-5):
    """Equal within ``rel`` of the output scale."""
    torch.testing.assert_close(actual, expected, atol=rel * float(expected.abs().max()), rtol=0)


def _ffn_mask(groups, seed=0):
    """Per group: a different number of neurons kept in every layer, layer 1 emptied."""
    gen = torch.Generator().manual_seed(seed)
    mask = {}
    for group, (layers, width) in groups.items():
        keep = torch.linspace(0.8, 0.3, layers).unsqueeze(1)  # keep about 80% ... 30%
        mask[group] = (torch.rand(layers, width, generator=gen) < keep).float()
        mask[group][1] = 0
    return mask


def _uniform_mask(groups, kept, seed=0):
    """Per group: ``kept`` neurons in every layer, other ids in each layer."""
    gen = torch.Generator().manual_seed(seed)
    mask = {}
    for group, (layers, width) in groups.items():
        mask[group] = torch.zeros(layers, width)
        for layer in range(layers):
            mask[group][layer, torch.randperm(width, generator=gen)[:kept]] = 1
    return mask


def _head_mask(gates):
    """Per attention group: layer 0 loses one head, layer 1 every head, the last layer two."""
    mask = gates.ones()
    for value in mask.values():
        value[0, 1] = 0
        value[1, :] = 0
        value[-1, [0, 2]] = 0
    return mask


def test_every_family_has_an_mlp_layout_and_a_tiny_model_here():
    assert all(family.mlp is not None for family in FAMILIES)
    assert {family_for(make()).name for make, _ in MODELS.values()} == {family.name for family in FAMILIES}


@pytest.mark.parametrize("name", MODELS)
def test_ffn_mask_pruned_equals_masked(name):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = FFNGates(model)
    mask = _ffn_mask(gates.groups)
    with gates.masked(mask):
        masked = _logits(model, batch)
    assert (masked - _logits(model, batch)).abs().max() > 1e-6  # the mask changes the output
    twin = make()  # never gated: pruning alone must make it run
    record = prune_ffn_mask(twin, mask)
    _close(_logits(twin, batch), masked)
    twin_gates = FFNGates(twin)
    assert twin_gates.groups == gates.groups  # masks and scores stay by original neuron id
    assert all(torch.equal(twin_gates.present()[g], m.bool()) for g, m in mask.items())
    assert record == ffn_record(twin) and all(str(1) in layers for layers in record.values())
    cost, twin_cost = model_cost(model, seq_len=16), model_cost(twin, seq_len=16)
    assert twin_cost.ffn_flops < cost.ffn_flops and twin_cost.neurons == sum(int(m.sum()) for m in mask.values())
    assert twin_cost.parameters == sum(p.numel() for p in twin.parameters())
    more = _ffn_mask(gates.groups, seed=1)  # the pruned model takes further masks by original id
    with twin_gates.masked(more), gates.masked({g: m * more[g] for g, m in mask.items()}):
        _close(_logits(twin, batch), _logits(model, batch))


@pytest.mark.parametrize("name", HEADS_PRUNABLE)
def test_joint_head_and_neuron_mask_pruned_equals_masked(name):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = unit_gates(model, "head+ffn")
    mask = {**_head_mask(gates.heads), **_ffn_mask(gates.ffn.groups)}
    with gates.masked(mask):
        masked = _logits(model, batch)
    with gates.heads.masked(_head_mask(gates.heads)):
        heads_only = _logits(model, batch)
    assert (masked - heads_only).abs().max() > 1e-6  # the neurons count beside the heads
    twin = make()
    records = prune_joint_mask(twin, mask)
    _close(_logits(twin, batch), masked)
    assert records == {"heads": pruning_record(twin), "ffn": ffn_record(twin)}
    assert unit_gates(twin, "head+ffn").groups == gates.groups


@pytest.mark.parametrize("name", MODELS)
def test_per_example_ffn_gates_equal_one_mask_at_a_time(name):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = FFNGates(model)
    rows = next(iter(batch.values())).shape[0]
    gen = torch.Generator().manual_seed(1)
    per_example = {g: torch.rand(rows, layers, width, generator=gen) for g, (layers, width) in gates.groups.items()}
    with gates.masked(per_example):
        together = _logits(model, batch)
    for row in range(rows):
        with gates.masked({g: m[row] for g, m in per_example.items()}):
            alone = _logits(model, batch)[row]
        _close(together[row], alone)


@pytest.mark.parametrize("name", ["llama", "opt", "gpt2", "t5"])
def test_ffn_importance_from_one_backward_equals_explicit_gates_and_the_example_loop(name):
    """Probes read in one backward == autograd's gradient of each example's loss by its own gate == one example at a time."""
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = FFNGates(model)
    probed = per_example_gate_gradients(model, gates, batch, unit="ffn")  # {group: (B, L, W)}
    rows = next(iter(probed.values())).shape[0]
    gate = {g: torch.ones(rows, layers, width, requires_grad=True) for g, (layers, width) in gates.groups.items()}
    with gates.masked(gate), torch.enable_grad():
        losses = per_example_loss(model(**model_inputs(model, batch)), batch)
    grads = dict(zip(gate, torch.autograd.grad(losses.sum(), list(gate.values()))))  # example b's loss depends on gate[b] only
    scale = max(float(g.abs().max()) for g in grads.values())
    for group, grad in grads.items():
        torch.testing.assert_close(probed[group].float(), grad, atol=1e-5 * scale, rtol=0)
    for row in range(rows):
        single = {k: v[row : row + 1] for k, v in batch.items()}
        alone = per_example_gate_gradients(model, gates, single, unit="ffn")
        for group in probed:
            torch.testing.assert_close(probed[group][row], alone[group][0], atol=1e-5 * scale, rtol=0)
    scores = importance_scores(model, gates, [batch], unit="ffn", normalize_layers=False)
    for group in probed:
        torch.testing.assert_close(scores[group].double(), probed[group].abs().mean(0), atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("name", ["llama", "marian"])
def test_joint_gradients_equal_head_and_neuron_gradients_apart(name):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    joint = unit_gates(model, "head+ffn")
    together = per_example_gate_gradients(model, joint, batch, unit=joint.unit)
    apart = {**per_example_gate_gradients(model, joint.heads, batch), **per_example_gate_gradients(model, joint.ffn, batch, unit="ffn")}
    assert set(together) == set(apart) == set(joint.groups)
    for group, value in apart.items():
        torch.testing.assert_close(together[group], value, atol=1e-6 * float(value.abs().max()), rtol=0)


def test_importance_of_the_pruned_model_equals_the_masked_one():
    model, batch = tiny_llama(), lm_batch()
    gates = FFNGates(model)
    mask = _ffn_mask(gates.groups)
    twin = tiny_llama()
    prune_ffn_mask(twin, mask)
    masked = importance_scores(model, gates, [batch], unit="ffn", mask=mask, normalize_layers=False)["dec_ffn"]
    pruned = importance_scores(twin, FFNGates(twin), [batch], unit="ffn", normalize_layers=False)["dec_ffn"]
    kept = mask["dec_ffn"].bool()
    torch.testing.assert_close(pruned[kept], masked[kept], atol=1e-5 * float(masked.max()), rtol=0)
    assert float(pruned[~kept].abs().max()) == 0  # removed neurons score 0


@pytest.mark.parametrize("name", MODELS)
def test_save_load_round_trips_uneven_widths(name, tmp_path):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    joint = unit_gates(model, "head+ffn")
    heads = _head_mask(joint.heads) if name in HEADS_PRUNABLE else joint.heads.ones()
    mask = {**heads, **_ffn_mask(joint.ffn.groups)}
    prune_joint_mask(model, mask)
    save_pruned(model, tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert config["headprune_ffn_widths"] == {g: [max(int(n), 1) for n in m.sum(1)] for g, m in mask.items() if g in joint.ffn.groups}
    loaded = load_pruned(tmp_path / "pruned")
    _close(_logits(loaded, batch), _logits(model, batch))
    assert ffn_record(loaded) == ffn_record(model) and pruning_record(loaded) == pruning_record(model)
    assert FFNGates(loaded).groups == joint.ffn.groups


@pytest.mark.parametrize("name", MODELS)
def test_save_load_round_trips_one_width_as_a_stock_config(name, tmp_path):
    """Every block keeps 24 neurons (other ids in each): the config's width field says 24 and transformers loads it unaided."""
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = FFNGates(model)
    prune_ffn_mask(model, _uniform_mask(gates.groups, kept=24))
    save_pruned(model, tmp_path / "pruned")
    config = json.loads((tmp_path / "pruned" / "config.json").read_text())
    assert {config[site.config_field] for site in gates.sites} == {24}
    loaded = load_pruned(tmp_path / "pruned")
    _close(_logits(loaded, batch), _logits(model, batch))
    assert ffn_record(loaded) == ffn_record(model) and FFNGates(loaded).groups == gates.groups
    stock = type(model).from_pretrained(tmp_path / "pruned").eval()
    _close(_logits(stock, batch), _logits(model, batch))


def test_an_edited_ffn_record_is_refused_on_load(tmp_path):
    model = tiny_bert()
    prune_neurons(model, {"enc_ffn": {0: [1, 2], 2: [5]}})
    save_pruned(model, tmp_path)
    record = json.loads((tmp_path / "headprune_pruning.json").read_text())
    record["kinds"]["ffn"]["pruned_neurons"]["enc_ffn"]["2"] = [6]  # the same width, another neuron
    (tmp_path / "headprune_pruning.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="SHA-256"):
        load_pruned(tmp_path)


@pytest.mark.parametrize("model_type", [t for t in DECODER_CONFIGS if t != "olmo2"])
def test_flops_counted_by_kept_width_equal_a_flop_counter(model_type):
    model = tiny_family(model_type, attn="eager")
    joint = unit_gates(model, "head+ffn")
    prune_joint_mask(model, {**_head_mask(joint.heads), **_ffn_mask(joint.ffn.groups)})
    tokens = 12
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.randint(3, 64, (1, tokens)))
    cost = model_cost(model, seq_len=tokens)
    assert cost.flops == counter.get_total_flops()
    assert cost.ffn_flops == sum(site.computed_width * neuron_flops(site, tokens) for site in joint.ffn.sites)


@pytest.mark.parametrize("name", ["opt", "gpt2", "llama"])
def test_greedy_generation_with_cache_pruned_equals_gated(name):
    make, _ = MODELS[name]
    model, twin = make(), make()
    gates = FFNGates(model)
    mask = _ffn_mask(gates.groups)
    prune_ffn_mask(twin, mask)
    batch = lm_batch(left_pad=True)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5, do_sample=False, pad_token_id=0)
    with gates.masked(mask):
        gated = model.generate(**kwargs)
    assert torch.equal(twin.generate(**kwargs), gated)


def test_pruning_twice_by_original_id_equals_pruning_once():
    once, twice = tiny_llama(), tiny_llama()
    prune_neurons(once, {"dec_ffn": {0: [1, 5, 9, 40], 2: list(range(64))}})
    prune_neurons(twice, {"dec_ffn": {0: [5, 40], 2: list(range(32))}})
    prune_neurons(twice, {"dec_ffn": {0: [1, 9, 40], 2: list(range(20, 64))}})  # 40 again: already gone
    assert ffn_record(once) == ffn_record(twice)
    _close(_logits(twice, lm_batch()), _logits(once, lm_batch()))
    assert FFNGates(twice).present()["dec_ffn"].sum(-1).tolist() == [60, 64, 0]
    assert twice.config.headprune_ffn_widths == {"dec_ffn": [60, 64, 1]}  # the emptied block computes its phantom


def test_a_deep_copy_has_ffn_gates_of_its_own():
    model = tiny_llama()
    gates = FFNGates(model)
    twin = copy.deepcopy(model)
    batch = lm_batch()
    plain = _logits(twin, batch)
    mask = _ffn_mask(gates.groups)
    with gates.masked(mask):
        torch.testing.assert_close(_logits(twin, batch), plain, atol=0, rtol=0)  # the original's mask leaves the copy alone
        masked = _logits(model, batch)
    with FFNGates(twin).masked(mask):
        _close(_logits(twin, batch), masked)


def test_a_mask_of_the_wrong_shape_names_the_group_and_both_shapes():
    gates = FFNGates(tiny_llama())
    with pytest.raises(ValueError, match=r"group 'dec_ffn' has shape \(3, 65\); expected \[3, 64\] \(layers x neurons\)"):
        gates.set_mask({"dec_ffn": torch.ones(3, 65)})
    with pytest.raises(ValueError, match="unknown FFN group 'enc_ffn'"):
        gates.set_mask({"enc_ffn": torch.ones(3, 64)})
    with pytest.raises(ValueError, match=r"0 \(remove the neuron\) or 1"):
        prune_ffn_mask(gates.model, {"dec_ffn": torch.full((3, 64), 0.5)})
    with pytest.raises(IndexError, match=r"neuron ids \[64\] out of range for dec_ffn layer 0 \(64 neurons\)"):
        prune_neurons(gates.model, {"dec_ffn": {0: [64]}})
    with pytest.raises(ValueError, match=r"unknown group\(s\) \['ffn'\].*head groups \['dec_self'\].*ffn groups \['dec_ffn'\]"):
        unit_gates(gates.model, "head+ffn").set_mask({"ffn": torch.ones(3, 64)})


def test_a_family_row_without_an_mlp_layout_refuses_ffn_units(monkeypatch):
    rows = tuple(replace(f, mlp=None) if f.name == "bert-like" else f for f in FAMILIES)
    monkeypatch.setattr(families, "FAMILIES", rows)
    model = tiny_bert()
    with pytest.raises(ValueError, match=r"model type 'bert' \(bert-like family\) has no MLP layout"):
        FFNGates(model)
    assert model_cost(model).neurons == 0 and HeadGates(model).groups == {"enc_self": (3, 4)}  # heads work as before
