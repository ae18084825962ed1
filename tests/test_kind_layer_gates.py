"""Layer gates on the tiny models: per-example gates, gate gradients (probes, autograd, finite differences), FLOPs and latency tables."""

import pytest
import torch
from test_ffn_units import MODELS
from test_kind_layer import _close, _logits
from tiny_llms import tiny_family, tiny_llama

from headprune.core.counting import model_cost
from headprune.core.inputs import model_inputs
from headprune.core.kinds import KINDS
from headprune.core.layer.removal import remove_layers
from headprune.core.pruning import prune_heads
from headprune.core.units import unit_gates
from headprune.scoring.importance import per_example_loss


@pytest.mark.parametrize("name", ["llama", "bert", "marian", "t5", "vit"])
def test_per_example_layer_gates_equal_one_mask_at_a_time(name):
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = unit_gates(model, "layer")
    rows = next(iter(batch.values())).shape[0]
    gen = torch.Generator().manual_seed(1)
    per_example = {g: torch.rand(rows, layers, 1, generator=gen) for g, (layers, _) in gates.groups.items()}
    with gates.masked(per_example):
        together = _logits(model, batch)
    for row in range(rows):
        with gates.masked({g: m[row] for g, m in per_example.items()}):
            _close(together[row], _logits(model, batch)[row])


def _probed_gradients(model, gates, batch):
    """{group: [B, layers, 1]} d loss_b / d g from the probes of one backward pass, through the kind's unit_grad."""
    kind = KINDS["layer"]
    out = {g: torch.zeros(next(iter(batch.values())).shape[0], layers, 1, dtype=torch.float64) for g, (layers, _) in gates.groups.items()}
    with gates.probing(), torch.enable_grad():
        losses = per_example_loss(model(**model_inputs(model, batch)), batch)
        probes = [p for site in gates.sites for p in site.probes]
        grads = dict(zip(map(id, probes), torch.autograd.grad(losses.sum(), probes)))
        for site in gates.sites:
            for probe in site.probes:
                grad, ids, group = kind.unit_grad(site, grads[id(probe)].double())
                out[group][:, site.layer, ids] += grad.sum(1)
    return out


@pytest.mark.parametrize("name", ["llama", "bert", "marian", "t5", "whisper"])
def test_probed_gate_gradients_equal_autograd_through_per_example_gates(name):
    """The probes' gradients of one backward == d loss_b / d gate[b] with one explicit gate per example and layer."""
    make, make_batch = MODELS[name]
    model, batch = make(), make_batch()
    gates = unit_gates(model, "layer")
    probed = _probed_gradients(model, gates, batch)
    rows = next(iter(probed.values())).shape[0]
    gate = {g: torch.ones(rows, layers, 1, requires_grad=True) for g, (layers, _) in gates.groups.items()}
    with gates.masked(gate), torch.enable_grad():
        losses = per_example_loss(model(**model_inputs(model, batch)), batch)
    grads = dict(zip(gate, torch.autograd.grad(losses.sum(), list(gate.values()))))
    scale = max(float(g.abs().max()) for g in grads.values())
    for group, grad in grads.items():
        torch.testing.assert_close(probed[group].float(), grad, atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("name", ["bert", "marian", "gpt2", "vit"])  # float64 throughout (RMSNorms compute in float32)
def test_layer_gate_gradient_equals_a_finite_difference_of_the_loss(name):
    make, make_batch = MODELS[name]
    model, batch = make().double(), make_batch()
    gates = unit_gates(model, "layer")
    probed = _probed_gradients(model, gates, batch)
    eps = 1e-4
    scale = max(float(g.abs().max()) for g in probed.values())
    for group, (layers, _) in gates.groups.items():
        for layer in range(layers):
            losses = []
            for step in (eps, -eps):
                gate = {group: torch.ones(layers, 1, dtype=torch.float64)}
                gate[group][layer] += step
                with gates.masked(gate), torch.no_grad():
                    losses.append(per_example_loss(model(**model_inputs(model, batch)), batch))
            difference = (losses[0] - losses[1]) / (2 * eps)  # (B,)
            torch.testing.assert_close(probed[group][:, layer, 0], difference, atol=1e-6 * scale, rtol=0)


@pytest.mark.parametrize("model_type", ["gpt2", "opt", "phi3", "falcon"])
def test_flops_table_prices_a_layer_as_the_cost_its_removal_saves(model_type):
    model = tiny_family(model_type, attn="eager")
    tables = KINDS["layer"].flops_tables(model, seq_len=12)
    twin = tiny_family(model_type, attn="eager")
    remove_layers(twin, {"dec_layer": [0, 2]})
    saved = model_cost(model, seq_len=12).flops - model_cost(twin, seq_len=12).flops
    assert saved == tables["dec_layer"][[0, 2], 1].sum()
    after = KINDS["layer"].flops_tables(twin, seq_len=12)["dec_layer"]
    assert torch.equal(after[:, 0], torch.zeros(3)) and torch.equal(after[:, 1], tables["dec_layer"][:, 1] * torch.tensor([0.0, 1.0, 0.0]))


def test_latency_table_sums_the_timed_heads_and_neurons_each_layer_keeps():
    model = tiny_llama()
    prune_heads(model, {"dec_self": {2: [0]}})
    remove_layers(model, {"dec_layer": [1]})
    heads = {"dec_self": torch.arange(3).unsqueeze(1) * 10.0 + torch.arange(5)}  # 10 x layer + heads kept
    ffn = {"dec_ffn": torch.arange(3).unsqueeze(1) * 1000.0 + torch.arange(65)}  # 1000 x layer + neurons kept
    table = KINDS["layer"].latency_tables(heads, ffn, model)["dec_layer"]
    assert table.tolist() == [[0, 4 + 64], [0, 0], [0, 23 + 2064]]
