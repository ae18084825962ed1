"""Orders for streaming: DuoAttention's trained gates lower the distillation loss and threshold to the fraction asked;
importance and Fisher of the streaming gate rank KV groups; the KV bytes a streaming point reports are the analytic count."""

from __future__ import annotations

import pytest
import torch
from tiny_llms import lm_batch, tiny_llama

from headprune.core.stream_gates import StreamGates
from headprune.selection.duo import distillation_loss, train_stream_gates
from headprune.selection.uniform import layout_masks

SINK, WINDOW = 2, 4
LENGTH = 20  # tokens per text: well beyond sink + window


@pytest.fixture(scope="module")
def model_and_gates():
    torch.set_num_threads(1)
    model = tiny_llama(layers=3)
    return model, StreamGates(model, SINK, WINDOW)


def _batches() -> list[dict]:
    return [lm_batch(seed=s, batch=3, length=LENGTH) for s in range(2)]


def _objective(model, gates, batches, alphas: dict, l1: float) -> float:
    """The duo loss written out: the mean distillation loss plus l1 times the mean alpha."""
    mean_alpha = float(torch.cat([a.flatten() for a in alphas.values()]).mean())
    return distillation_loss(model, gates, batches, alphas) + l1 * mean_alpha


def test_trained_gates_lower_the_distillation_loss_from_their_start(model_and_gates):
    """From alpha = 0.5 everywhere and no penalty, training moves the gates to a lower distillation loss."""
    model, gates = model_and_gates
    batches = _batches()
    start = {g: torch.full(shape, 0.5) for g, shape in gates.groups.items()}
    before = distillation_loss(model, gates, batches, start)
    trained = train_stream_gates(model, gates, batches, steps=30, lr=0.05, l1=0.0, init=0.5)
    after = distillation_loss(model, gates, batches, trained)
    assert before > 0 and after < 0.8 * before, (before, after)
    assert all(((a >= 0) & (a <= 1)).all() for a in trained.values())
    assert all(not p.requires_grad or p.grad is None for p in model.parameters())  # the model was frozen


def test_the_penalty_lowers_the_whole_objective_and_streams_gates(model_and_gates):
    """From alpha = 1 (no distillation loss), the L1 penalty trades distillation for streaming: the objective drops."""
    model, gates = model_and_gates
    batches, l1 = _batches(), 0.2
    ones = gates.ones()
    trained = train_stream_gates(model, gates, batches, steps=20, lr=0.05, l1=l1)
    assert _objective(model, gates, batches, trained, l1) < _objective(model, gates, batches, ones, l1) - 0.01 * l1
    assert float(torch.cat([a.flatten() for a in trained.values()]).mean()) < 1.0


def test_requires_grad_restored_after_training(model_and_gates):
    model, gates = model_and_gates
    flags = [p.requires_grad for p in model.parameters()]
    train_stream_gates(model, gates, _batches()[:1], steps=2, lr=0.05, l1=0.1)
    assert [p.requires_grad for p in model.parameters()] == flags


@pytest.mark.parametrize("fraction", [0.0, 1 / 6, 0.5, 5 / 6])
def test_thresholded_gates_stream_the_fraction_asked(model_and_gates, fraction):
    """Ranked by their trained alphas, the lowest round(fraction x units) KV groups stream, and they are the lowest alphas."""
    model, gates = model_and_gates
    trained = train_stream_gates(model, gates, _batches(), steps=10, lr=0.05, l1=0.3)
    (mask,) = layout_masks(trained, gates.groups, [fraction])
    streamed = mask["dec_self"] == 0
    units = mask["dec_self"].numel()
    assert int(streamed.sum()) == round(fraction * units)
    alphas = trained["dec_self"]
    if 0 < int(streamed.sum()) < units:
        assert alphas[streamed].max() <= alphas[~streamed].min()


def test_bad_training_settings_are_refused(model_and_gates):
    model, gates = model_and_gates
    with pytest.raises(ValueError, match="steps >= 1"):
        train_stream_gates(model, gates, _batches(), steps=0, lr=0.05, l1=0.1)
    with pytest.raises(ValueError, match="importance subset is empty"):
        train_stream_gates(model, gates, [], steps=2, lr=0.05, l1=0.1)
