"""Least-squares recovery: identity when nothing is pruned, the ridge solution on the unpruned inputs, masked and pruned twins
agree, damped scales that do not amplify round-off, never worse than the mask alone on its data, it survives save/load."""

import copy
import subprocess
import sys
import textwrap

import torch
import torch.nn.functional as F
from conftest import classifier_batch, seq2seq_batch, tiny_bert, tiny_marian

from headprune.core.attention.gates import HeadGates
from headprune.core.inputs import eval_mode
from headprune.core.projections import linear_weight
from headprune.core.pruning import prune_mask
from headprune.core.saving import load_pruned, save_pruned
from headprune.core.units import QUERY_HEADS, unit_gates
from headprune.selection.layer_replay import captured_pass
from headprune.selection.lsq import head_contributions, lsq_recover, valid_rows


def _logits(model, batch):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def _mask(gates):
    mask = gates.ones()
    mask["enc_self"][0, [0, 2]] = 0
    mask["enc_self"][1, 1] = 0
    mask["enc_self"][2, [0, 1, 3]] = 0
    return mask


@torch.no_grad()
def layer_output_errors(model, gates, teacher, batches) -> dict[str, torch.Tensor]:
    """Relative squared error ||out - out_teacher||^2 / ||out_teacher||^2 of every attention layer's output projection, both
    on the teacher's inputs to it."""
    teacher_gates = unit_gates(teacher, QUERY_HEADS)
    errors = {g: torch.zeros(layers, dtype=torch.float64) for g, (layers, _) in gates.groups.items()}
    norms = {g: torch.zeros(layers, dtype=torch.float64) for g, (layers, _) in gates.groups.items()}
    for batch in batches:
        with eval_mode(teacher):
            reference = captured_pass(teacher, {id(ref): ref.linear("output") for ref in teacher_gates.sites}, batch)
        for site in gates.sites:
            ref = teacher_gates.site(site.group, site.layer)
            x = valid_rows(site, batch, reference[id(ref)])  # (N, the teacher's width)
            at = [ref.head_ids.index(unit) for unit in site.head_ids]
            out = head_contributions(x, site.linear("output"), list(range(len(at))), site.head_dim, at).sum(1).double()
            ref_out = F.linear(x, linear_weight(ref.linear("output"))).double()
            errors[site.group][site.layer] += float((out - ref_out).pow(2).sum())
            norms[site.group][site.layer] += float(ref_out.pow(2).sum())
    return {g: errors[g] / norms[g].clamp(min=1e-30) for g in errors}


BATCHES = [classifier_batch(seed=s, batch=8, length=12) for s in range(3)]
PLAIN = (1.0,)  # the plain least squares, not shrunk by the loss


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
    masked_scales = lsq_recover(model, gates, BATCHES, mask=mask, shrinks=PLAIN)
    pruned_scales = lsq_recover(pruned, HeadGates(pruned), BATCHES, teacher=teacher, shrinks=PLAIN)
    torch.testing.assert_close(masked_scales["enc_self"], pruned_scales["enc_self"], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(masked_scales["enc_self"], torch.ones(3, 4))
    with gates.masked(mask):
        masked = _logits(model, BATCHES[1])
    torch.testing.assert_close(_logits(pruned, BATCHES[1]), masked, atol=1e-5, rtol=0)
    twin = copy.deepcopy(model)
    HeadGates(twin).set_mask(None)
    prune_mask(twin, mask)  # the scales folded into the masked model survive physical pruning
    torch.testing.assert_close(_logits(twin, BATCHES[1]), masked, atol=1e-5, rtol=0)


def _ridge_scales(model, mask, batches, layer: int, ridge: float) -> torch.Tensor:
    """The ridge solution of one BERT layer computed another way: its head outputs hooked, the design matrix built
    whole and solved by torch.linalg.lstsq on the system augmented with sqrt(lam) (s - 1) = 0."""
    attention = model.bert.encoder.layer[layer].attention.output.dense
    kept = [h for h in range(4) if mask["enc_self"][layer, h]]
    rows, targets = [], []
    for batch in batches:
        seen = []
        handle = attention.register_forward_hook(lambda module, args, out: seen.append(args[0].detach()))
        with torch.no_grad():
            model(**{k: v for k, v in batch.items() if k != "labels"})
        handle.remove()
        x = seen[0][batch["attention_mask"].bool()].double()  # (N, 4 * 8) at the real tokens
        w = attention.weight.detach().double()  # (hidden, 4 * 8)
        targets.append((x @ w.T).reshape(-1))
        rows.append(torch.stack([(x[:, 8 * h : 8 * h + 8] @ w[:, 8 * h : 8 * h + 8].T).reshape(-1) for h in kept], 1))
    a, y = torch.cat(rows), torch.cat(targets)  # (N * hidden, K), (N * hidden,)
    lam = ridge * float((a * a).sum(0).mean())
    k = len(kept)
    augmented = torch.cat([a, lam**0.5 * torch.eye(k, dtype=a.dtype)])
    return torch.linalg.lstsq(augmented, torch.cat([y, lam**0.5 * torch.ones(k, dtype=a.dtype)]).unsqueeze(1)).solution.squeeze(1)


def test_least_squares_scales_are_the_ridge_solution_on_the_unpruned_inputs():
    model = tiny_bert()
    mask = _mask(HeadGates(model))
    reference = copy.deepcopy(model)
    scales = lsq_recover(model, HeadGates(model), BATCHES, mask=mask, ridge=0.05, shrinks=PLAIN)["enc_self"]
    for layer in range(3):
        expected = _ridge_scales(reference, mask, BATCHES, layer, ridge=0.05)
        torch.testing.assert_close(scales[layer][mask["enc_self"][layer].bool()].double(), expected, atol=1e-5, rtol=1e-4)


def test_a_layer_that_loses_no_head_keeps_its_weights():
    """Fitting on the pruned model's own inputs shrank untouched layers (errors in variables); these stay as they are."""
    model = tiny_bert(seed=2)
    gates = HeadGates(model)
    mask = gates.ones()
    mask["enc_self"][0, [1, 3]] = 0  # only the first layer loses heads
    before = [site.linear("output").weight.detach().clone() for site in gates.sites]
    scales = lsq_recover(model, gates, BATCHES, mask=mask, shrinks=PLAIN)["enc_self"]
    after = [site.linear("output").weight.detach() for site in gates.sites]
    assert not torch.equal(before[0], after[0]) and torch.equal(before[1], after[1]) and torch.equal(before[2], after[2])
    assert torch.equal(scales[1:], torch.ones(2, 4))


def test_recovery_lowers_the_error_it_fits_in_every_layer():
    model = tiny_bert(seed=1)
    teacher = copy.deepcopy(model)
    gates = HeadGates(model)
    mask = _mask(gates)
    prune_mask(model, mask)
    before = layer_output_errors(model, gates, teacher, BATCHES)["enc_self"]
    lsq_recover(model, gates, BATCHES, teacher=teacher, shrinks=PLAIN)
    after = layer_output_errors(model, gates, teacher, BATCHES)["enc_self"]
    assert torch.all(after <= before * (1 + 1e-9)) and float(after.sum()) < float(before.sum())


def test_seq2seq_recovery_runs_every_group_and_lowers_the_error():
    model = tiny_marian()
    teacher, gates = _pruned_with_teacher(model)
    batches = [seq2seq_batch(seed=s) for s in range(3)]
    before = layer_output_errors(model, gates, teacher, batches)
    scales = lsq_recover(model, gates, batches, teacher=teacher, shrinks=PLAIN)
    after = layer_output_errors(model, gates, teacher, batches)
    assert set(scales) == {"enc_self", "enc_dec", "dec_self"}
    assert all(torch.all(after[g] <= before[g] * (1 + 1e-9)) for g in after)
    assert sum(float(a.sum()) for a in after.values()) < sum(float(b.sum()) for b in before.values())


def _twin_heads(seed: int = 3):
    """A tiny BERT whose second layer has heads 0 and 1 nearly equal (collinear shares: an ill-posed least squares)."""
    model = tiny_bert(seed=seed)
    layer = model.bert.encoder.layer[1].attention
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for linear in (layer.self.query, layer.self.key, layer.self.value):
            linear.weight[8:16] = linear.weight[0:8] + 1e-4 * torch.randn(8, linear.weight.shape[1], generator=gen)
            linear.bias[8:16] = linear.bias[0:8]
        layer.output.dense.weight[:, 8:16] = layer.output.dense.weight[:, 0:8]
    return model


def _f16_difference(model) -> float:
    """How far the second layer's attention output moves when its output projection is rounded to float16 (as an f16
    export stores it), relative to the output's scale, on the heads' outputs of the fitted batches."""
    dense = model.bert.encoder.layer[1].attention.output.dense
    seen = []
    handle = dense.register_forward_hook(lambda module, args, out: seen.append(args[0].detach()))
    with torch.no_grad():
        for batch in BATCHES:
            model(**{k: v for k, v in batch.items() if k != "labels"})
    handle.remove()
    x = torch.cat([h.flatten(0, 1) for h in seen]).double()
    x[:, 16:] = 0  # the pruned heads' outputs: gated off
    weight = dense.weight.detach().double()
    exact, rounded = x @ weight.T, x @ weight.half().double().T
    return float((rounded - exact).abs().max() / exact.abs().max())


def test_damped_scales_stay_bounded_and_do_not_amplify_round_off():
    mask = {"enc_self": torch.ones(3, 4)}
    mask["enc_self"][1, [2, 3]] = 0  # keeps the two near-twin heads of layer 1
    alone = _twin_heads()
    damped, undamped = _twin_heads(), _twin_heads()
    kept = mask["enc_self"][1].bool()
    tame = lsq_recover(damped, HeadGates(damped), BATCHES, mask=mask, shrinks=PLAIN)["enc_self"][1][kept]
    wild = lsq_recover(undamped, HeadGates(undamped), BATCHES, mask=mask, ridge=1e-14, max_scale=1e6, shrinks=PLAIN)["enc_self"][1][kept]
    assert float(wild.abs().max()) > 20  # undamped: large scales of opposite signs cancel on the fitted tokens
    assert float(tame.abs().max()) < 1.5 and float((tame[0] - tame[1]).abs()) < 0.2  # damped: the twins share the work

    def norm(model):
        return float(model.bert.encoder.layer[1].attention.output.dense.weight.norm())

    assert norm(damped) < 1.5 * norm(alone) < norm(undamped) / 10
    assert _f16_difference(damped) < 2 * _f16_difference(alone) < _f16_difference(undamped) / 5


def test_recovery_is_never_worse_than_the_mask_alone_on_the_data_it_was_fit_on():
    from tiny_llms import causal_lm_loss, lm_batch, tiny_llama

    batches = [lm_batch(seed=s, batch=4, length=12) for s in range(3)]
    mask = {"dec_self": torch.tensor([[1.0, 1, 0, 0], [0, 0, 1, 1], [1, 1, 1, 1]])}

    def mean_loss(model):
        with torch.no_grad(), HeadGates(model).masked(mask):
            return sum(float(causal_lm_loss(model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]), b).sum()) for b in batches)

    alone = tiny_llama(seed=4)
    for loss_fn in (causal_lm_loss, _distance_to(alone, mask)):  # the task's loss; a loss that any change makes worse
        model, report = tiny_llama(seed=4), {}
        lsq_recover(model, HeadGates(model), batches, mask=mask, loss_fn=loss_fn, report=report)
        assert report["layers_fitted"] == 2 and set(report["fit_loss"]) == {"1", "0.5", "0.25", "0"}
        assert report["fit_loss"][f"{report['shrink']:g}"] == min(report["fit_loss"].values())
        assert mean_loss(model) <= mean_loss(alone) * (1 + 1e-9)
    assert report["shrink"] == 0  # the last loss: the mask alone is kept, weights and all
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), alone.state_dict().values()))


def _distance_to(reference, mask):
    """A per-example loss that is 0 for ``reference``'s logits under ``mask`` and grows with any change."""

    def loss(outputs, batch):
        with torch.no_grad(), HeadGates(reference).masked(mask):
            target = reference(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        return (outputs.logits - target).pow(2).flatten(1).sum(1)

    return loss


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
