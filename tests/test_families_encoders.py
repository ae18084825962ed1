"""DistilBERT, ViT, DeiT, T5, Whisper and DeBERTa-v2: gates, per-example gates, one-backward importance, pruning, saving.

Every check compares two ways of computing the same thing on a tiny random model (fp32, 2-3 layers x 4 heads).
"""

import json

import pytest
import torch
from conftest import classifier_batch, tiny_bert
from mask_references import looped_mask_logits
from tiny_encoders import FAMILY_MODELS
from tiny_llms import tiny_llama

from headprune.core.attention.gates import HeadGates, find_sites
from headprune.core.counting import model_cost
from headprune.core.families import supported_model_types
from headprune.core.inputs import model_inputs
from headprune.core.pruning import prune_mask
from headprune.core.saving import RECORD_FILE, load_pruned, save_pruned
from headprune.engine.ablation import MaskBatcher, single_unit_masks
from headprune.scoring.importance import per_example_gate_gradients, per_example_loss

TOLERANCE = 1e-5  # relative to the output's scale


def _logits(model, batch):
    with torch.no_grad():
        return model(**model_inputs(model, batch)).logits


def _assert_close_scaled(actual, expected, tolerance=TOLERANCE):
    """|actual - expected| within ``tolerance`` times the largest |expected|."""
    scale = expected.abs().max().item()
    assert (actual - expected).abs().max().item() <= tolerance * scale, f"differ by more than {tolerance} x {scale:.3g}"


def _uneven_mask(gates):
    """Per group: layer 0 loses one head, layer 1 every head, the last layer two (an emptied layer, uneven counts)."""
    mask = gates.ones()
    for value in mask.values():
        value[0, 1] = 0
        value[1, :] = 0
        value[-1, [0, 2]] = 0
    return mask


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_masked_model_equals_pruned_twin(name):
    make, make_batch = FAMILY_MODELS[name]
    model, batch = make(), make_batch()
    gates = HeadGates(model)
    mask = _uneven_mask(gates)
    with gates.masked(mask):
        masked = _logits(model, batch)
    assert (masked - _logits(model, batch)).abs().max() > 1e-6  # the mask changes the output
    twin = make()
    prune_mask(twin, mask)
    assert sum(len(s.head_ids) for s in find_sites(twin)) == sum(int(m.sum()) for m in mask.values())
    _assert_close_scaled(_logits(twin, batch), masked)
    cost, twin_cost = model_cost(model, seq_len=16), model_cost(twin, seq_len=16)
    assert twin_cost.parameters == sum(p.numel() for p in twin.parameters()) < cost.parameters
    assert twin_cost.attention_flops < cost.attention_flops and twin_cost.heads == sum(len(s.head_ids) for s in find_sites(twin))
    twin_gates = HeadGates(twin)  # the pruned model still takes masks by original head id
    more = _uneven_mask(twin_gates)
    more[next(iter(more))][-1, 3] = 0
    with twin_gates.masked(more), gates.masked(more):
        _assert_close_scaled(_logits(twin, batch), _logits(model, batch))


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_per_example_gates_equal_one_mask_at_a_time(name):
    make, make_batch = FAMILY_MODELS[name]
    model, batch = make(), make_batch()
    gates = HeadGates(model)
    rows = next(iter(batch.values())).shape[0]
    gen = torch.Generator().manual_seed(1)
    per_example = {g: torch.rand(rows, layers, heads, generator=gen) for g, (layers, heads) in gates.groups.items()}
    with gates.masked(per_example):
        together = _logits(model, batch)
    for row in range(rows):
        with gates.masked({g: m[row] for g, m in per_example.items()}):
            alone = _logits(model, batch)[row]
        _assert_close_scaled(together[row], alone)


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_one_backward_importance_equals_gate_gradient(name):
    """Per-token probes read in one backward pass == autograd's gradient of each example's loss by its own gate."""
    make, make_batch = FAMILY_MODELS[name]
    model, batch = make(), make_batch()
    gates = HeadGates(model)
    probed = per_example_gate_gradients(model, gates, batch)  # {group: (B, L, H)}
    rows = next(iter(probed.values())).shape[0]
    gate = {g: torch.ones(rows, layers, heads, requires_grad=True) for g, (layers, heads) in gates.groups.items()}
    with gates.masked(gate):
        losses = per_example_loss(model(**model_inputs(model, batch)), batch)
    grads = torch.autograd.grad(losses.sum(), list(gate.values()))  # example b's loss depends on gate[b] only
    for group, grad in zip(gate, grads):
        _assert_close_scaled(probed[group].float(), grad)


@pytest.mark.parametrize("name", FAMILY_MODELS)
def test_save_load_round_trip(name, tmp_path):
    make, make_batch = FAMILY_MODELS[name]
    model, batch = make(), make_batch()
    record = prune_mask(model, _uneven_mask(HeadGates(model)))
    save_pruned(model, tmp_path / "pruned")
    loaded = load_pruned(tmp_path / "pruned")
    assert loaded.config.headprune_pruned_heads == record
    torch.testing.assert_close(_logits(loaded, batch), _logits(model, batch), atol=0, rtol=0)


@pytest.mark.parametrize("name", ["distilbert", "vit", "deit", "deberta-v2"])
def test_batched_ablation_engine_equals_loop(name):
    make, make_batch = FAMILY_MODELS[name]
    model = make()
    batch = {k: v for k, v in make_batch().items() if k != "labels"}
    gates = HeadGates(model)
    masks, _ = single_unit_masks(gates.groups)
    masks.append(_uneven_mask(gates))
    batched = MaskBatcher(model, gates, max_rows=16).logits(batch, masks)
    _assert_close_scaled(batched, looped_mask_logits(model, gates, batch, masks))


def test_batched_ablation_engine_with_the_output_gate_on_bert():
    """The engine shares layer attention across masks; with the hook the gate is applied once, at the output projection."""
    model = tiny_bert()
    batch = {k: v for k, v in classifier_batch().items() if k != "labels"}
    gates = HeadGates(model, gate_at="output")
    masks, _ = single_unit_masks(gates.groups)
    masks.append(_uneven_mask(gates))
    batched = MaskBatcher(model, gates, max_rows=16).logits(batch, masks)
    _assert_close_scaled(batched, looped_mask_logits(model, gates, batch, masks))
    reference = tiny_bert()
    _assert_close_scaled(batched, looped_mask_logits(reference, HeadGates(reference), batch, masks))


def _bert_batch():
    return classifier_batch()


def _llama_batch():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 64, (3, 7), generator=gen)
    attention = torch.ones_like(ids)
    attention[0, 5:] = 0
    labels = ids.masked_fill(attention == 0, -100)
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


@pytest.mark.parametrize("make,make_batch", [(tiny_bert, _bert_batch), (tiny_llama, _llama_batch)], ids=["bert", "llama"])
def test_output_projection_gate_equals_attention_gate(make, make_batch):
    batch = make_batch()
    by_attention, by_output = make(), make()
    attention_gates, output_gates = HeadGates(by_attention, gate_at="attention"), HeadGates(by_output, gate_at="output")
    assert by_output.config._attn_implementation == attention_gates.inner  # the hook needs no attention wrapper
    rows = batch["input_ids"].shape[0]
    gen = torch.Generator().manual_seed(2)
    masks = [_uneven_mask(attention_gates), {g: torch.rand(rows, *shape, generator=gen) for g, shape in attention_gates.groups.items()}]
    for mask in masks:
        with attention_gates.masked(mask), output_gates.masked(mask):
            _assert_close_scaled(_logits(by_output, batch), _logits(by_attention, batch))
    for mask in (None, masks[0]):
        expected = per_example_gate_gradients(by_attention, attention_gates, batch, mask=mask)
        actual = per_example_gate_gradients(by_output, output_gates, batch, mask=mask)
        for group in expected:
            _assert_close_scaled(actual[group], expected[group])


def test_output_gate_follows_pruning():
    """Pruning replaces the output projection: the gate hook moves to the new one."""
    model, batch = tiny_bert(), _bert_batch()
    gates = HeadGates(model, gate_at="output")
    reference = tiny_bert()
    reference_gates = HeadGates(reference)
    prune_mask(model, {"enc_self": torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]])})
    mask = {"enc_self": torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [1, 1, 0, 1]])}
    with gates.masked(mask), reference_gates.masked(mask):
        _assert_close_scaled(_logits(model, batch), _logits(reference, batch))


def test_unsupported_model_type_lists_the_new_families():
    from transformers import GPTBigCodeConfig, GPTBigCodeModel

    model = GPTBigCodeModel(GPTBigCodeConfig(n_embd=16, n_layer=1, n_head=2, vocab_size=10))
    with pytest.raises(ValueError, match="does not support model type 'gpt_bigcode'") as err:
        HeadGates(model)
    for model_type in ("distilbert", "vit", "deit", "t5", "mt5", "whisper", "deberta-v2"):
        assert model_type in supported_model_types() and model_type in str(err.value)


@pytest.mark.parametrize("name", ["distilbert", "vit", "deit"])
def test_v4_pruned_heads_written_and_read(name, tmp_path):
    """DistilBERT, ViT and DeiT get v4's config.pruned_heads; a directory holding only that (as v4 wrote it) loads the same."""
    make, make_batch = FAMILY_MODELS[name]
    model, batch = make(), make_batch()
    prune_mask(model, {"enc_self": torch.tensor([[1, 0, 1, 0], [1, 1, 1, 1], [0, 1, 1, 1]])})
    save_pruned(model, tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["pruned_heads"] == {"0": [1, 3], "2": [0]}
    del config["headprune_pruned_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / RECORD_FILE).unlink()
    loaded = load_pruned(tmp_path)
    assert loaded.config.headprune_pruned_heads == {"enc_self": {"0": [1, 3], "2": [0]}}
    torch.testing.assert_close(_logits(loaded, batch), _logits(model, batch), atol=0, rtol=0)


def test_attention_entropy_refuses_heads_gated_at_the_output():
    from headprune.core.checks import ConfigError
    from headprune.scoring.importance import attention_entropy

    make, make_batch = FAMILY_MODELS["deberta-v2"]
    model = make()
    batch = {k: v for k, v in make_batch().items() if k != "labels"}
    with pytest.raises(ConfigError, match="prune.order=importance"):
        attention_entropy(model, HeadGates(model), [batch])
    model = tiny_bert()
    assert attention_entropy(model, HeadGates(model), [batch])["enc_self"].min() > 0  # through the wrapper: recorded


def test_t5_attention_entropy_includes_the_position_bias():
    """Entropy read in the wrapper == the entropy of the probabilities eager attention returns, in all three groups."""
    from headprune.scoring.importance import attention_entropy

    model = FAMILY_MODELS["t5"][0]()
    model.set_attn_implementation("eager")
    gen = torch.Generator().manual_seed(3)
    batch = {"input_ids": torch.randint(2, 50, (2, 7), generator=gen), "labels": torch.randint(2, 50, (2, 5), generator=gen)}
    batch["attention_mask"] = torch.ones_like(batch["input_ids"])
    with torch.no_grad():
        out = model(**model_inputs(model, batch), output_attentions=True)
    probabilities = {"enc_self": out.encoder_attentions, "enc_dec": out.cross_attentions, "dec_self": out.decoder_attentions}
    expected = {
        g: torch.stack([-(p * p.clamp(min=1e-30).log()).sum(-1).mean((0, 2)) for p in layers]) for g, layers in probabilities.items()
    }
    recorded = attention_entropy(model, HeadGates(model), [model_inputs(model, batch) | {"labels": batch["labels"]}])
    for group, value in expected.items():
        _assert_close_scaled(recorded[group], value)


@pytest.mark.parametrize("name", ["t5", "whisper"])
def test_generation_with_cache_pruned_equals_masked(name):
    """Beam search with the KV cache (T5: the position bias of later steps) gives the masked model's tokens and scores."""
    make, make_batch = FAMILY_MODELS[name]
    model, twin = make(), make()
    inputs = {k: v for k, v in make_batch().items() if k not in ("labels", "decoder_input_ids")}
    gates = HeadGates(model)
    mask = _uneven_mask(gates)
    prune_mask(twin, mask)
    settings = {"max_new_tokens": 5, "num_beams": 2, "do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    with torch.no_grad(), gates.masked(mask):
        masked = model.generate(**inputs, **settings)
    with torch.no_grad():
        pruned = twin.generate(**inputs, **settings)
    assert torch.equal(masked.sequences, pruned.sequences)
    _assert_close_scaled(torch.stack(pruned.scores), torch.stack(masked.scores))
