"""Per-example importance from one backward pass equals the per-example loop and finite differences."""

import torch
from conftest import classifier_batch, seq2seq_batch, tiny_bert, tiny_marian

from headprune.core.attention.gates import HeadGates
from headprune.scoring.importance import attention_entropy, importance_scores, per_example_gate_gradients, per_example_loss


def _single(batch, row):
    """Example ``row`` alone, without its padding."""
    length = int(batch["attention_mask"][row].sum())
    return {k: (v[row : row + 1, :length] if k != "labels" else v[row : row + 1]) for k, v in batch.items()}


def test_batched_gradients_equal_single_example_loop():
    model = tiny_bert()
    gates = HeadGates(model)
    batch = classifier_batch(batch=4)
    together = per_example_gate_gradients(model, gates, batch)["enc_self"]
    for row in range(4):
        alone = per_example_gate_gradients(model, gates, _single(batch, row))["enc_self"][0]
        torch.testing.assert_close(together[row], alone, atol=1e-6, rtol=0)


def test_importance_equals_mean_of_single_examples():
    model = tiny_bert()
    gates = HeadGates(model)
    batch = classifier_batch(batch=4)
    batched = importance_scores(model, gates, [batch], normalize_layers=False)["enc_self"]
    loop = sum(per_example_gate_gradients(model, gates, _single(batch, r))["enc_self"][0].abs() for r in range(4)) / 4
    torch.testing.assert_close(batched, loop.float(), atol=1e-6, rtol=0)


def test_seq2seq_batched_gradients_equal_loop():
    model = tiny_marian()
    gates = HeadGates(model)
    batch = seq2seq_batch()
    together = per_example_gate_gradients(model, gates, batch)
    for row in range(batch["input_ids"].shape[0]):
        src_len = int(batch["attention_mask"][row].sum())
        labels = batch["labels"][row]
        tgt_len = int((labels != -100).sum())
        one = {
            "input_ids": batch["input_ids"][row : row + 1, :src_len],
            "attention_mask": batch["attention_mask"][row : row + 1, :src_len],
            "labels": labels[None, :tgt_len],
        }
        alone = per_example_gate_gradients(model, gates, one)
        for group in together:
            torch.testing.assert_close(together[group][row], alone[group][0], atol=1e-6, rtol=0)


def test_gate_gradient_matches_finite_difference():
    model = tiny_bert(dtype=torch.float64)
    gates = HeadGates(model)
    batch = classifier_batch()
    grads = per_example_gate_gradients(model, gates, batch)["enc_self"]
    eps = 1e-5
    for layer, head in [(0, 1), (1, 2), (2, 3)]:
        losses = []
        for value in (1 + eps, 1 - eps):
            mask = gates.ones()
            mask["enc_self"] = mask["enc_self"].double()
            mask["enc_self"][layer, head] = value
            with gates.masked(mask), torch.no_grad():
                losses.append(per_example_loss(model(**batch), batch))
        finite = (losses[0] - losses[1]) / (2 * eps)
        torch.testing.assert_close(grads[:, layer, head], finite, atol=1e-7, rtol=1e-4)


def test_reductions_and_normalisation():
    model = tiny_bert()
    gates = HeadGates(model)
    batches = [classifier_batch(seed=s) for s in range(2)]
    scores = {r: importance_scores(model, gates, batches, reduce=r) for r in ("example", "token", "batch")}
    for value in scores.values():
        torch.testing.assert_close(value["enc_self"].norm(dim=-1), torch.ones(3), atol=1e-5, rtol=0)
    raw = {r: importance_scores(model, gates, batches, reduce=r, normalize_layers=False)["enc_self"] for r in ("example", "token")}
    assert torch.all(raw["token"] >= raw["example"] - 1e-7)  # |sum| <= sum |.|
    glob = importance_scores(model, gates, batches, normalize_global=True)["enc_self"]
    assert glob.min() == 0 and abs(glob.max().item() - 1) < 1e-6


def _direct_batch_mean_gradients(model, batch):
    """|d mean_b L(x_b) / d xi| for one batch, through a plain leaf gate tensor (the bertology recipe)."""
    gates = HeadGates(model)
    gate = torch.ones(3, 4, requires_grad=True)
    gates.set_mask(gate)
    loss = per_example_loss(model(**{k: v for k, v in batch.items() if k != "labels"}), batch).mean()
    (grad,) = torch.autograd.grad(loss, gate)
    gates.set_mask(None)
    return grad.abs()


def test_batch_reduction_uses_the_batch_mean_loss_with_uneven_batches():
    model = tiny_bert()
    gates = HeadGates(model)
    batches = [classifier_batch(seed=1, batch=4), classifier_batch(seed=2, batch=1)]  # the last batch is smaller
    scores = importance_scores(model, gates, batches, reduce="batch", normalize_layers=False)["enc_self"]
    direct = sum(_direct_batch_mean_gradients(model, b) for b in batches) / len(batches)
    torch.testing.assert_close(scores, direct, atol=1e-6, rtol=1e-5)


def test_importance_keeps_labels_out_of_the_forward():
    model = tiny_marian()
    gates = HeadGates(model)
    seen = []
    model.register_forward_pre_hook(lambda module, args, kwargs: seen.append(sorted(kwargs)), with_kwargs=True)
    batch = seq2seq_batch()
    importance_scores(model, gates, [batch])
    per_example_gate_gradients(model, gates, batch)
    assert seen and all("labels" not in keys and "decoder_input_ids" in keys for keys in seen)
    assert "labels" in batch  # the caller's batch is left as it was


def test_entropy_is_within_bounds():
    model = tiny_bert()
    gates = HeadGates(model)
    batch = classifier_batch()
    entropy = attention_entropy(model, gates, [batch])["enc_self"]
    assert entropy.shape == (3, 4)
    assert torch.all(entropy > 0) and torch.all(entropy <= torch.log(torch.tensor(9.0)) + 1e-5)


def test_fisher_from_one_backward_equals_single_example_loop():
    from headprune.scoring.importance import fisher_scores

    model = tiny_bert(dtype=torch.float64)
    gates = HeadGates(model)
    batches = [classifier_batch(seed=s) for s in range(2)]
    batched = fisher_scores(model, gates, batches)["enc_self"]
    singles = [_single(b, r) for b in batches for r in range(4)]
    loop = sum(per_example_gate_gradients(model, gates, one)["enc_self"][0] ** 2 for one in singles) / len(singles)
    torch.testing.assert_close(batched.double(), loop, atol=1e-6, rtol=1e-5)
    assert torch.all(batched > 0)


def test_fisher_under_mask_scores_masked_heads_zero():
    from headprune.scoring.importance import fisher_scores

    model = tiny_bert()
    gates = HeadGates(model)
    mask = gates.ones()
    mask["enc_self"][1, 2] = 0
    scores = fisher_scores(model, gates, [classifier_batch()], mask=mask)["enc_self"]
    unmasked = fisher_scores(model, gates, [classifier_batch()])["enc_self"]
    assert scores[1, 2] == 0 and unmasked[1, 2] > 0
