"""Every family row on a tiny random model: the obs orders price each kind they can, and reconstructing a masked model gives
what reconstructing its physically pruned twin gives."""

import copy

import pytest
import torch
from conftest import classifier_batch
from mask_references import random_half_mask
from tiny_encoders import FAMILY_MODELS, VOCAB
from tiny_llms import DECODER_CONFIGS, LLAMA_LIKE_CONFIGS, lm_batch, tiny_family

from headprune.core.inputs import model_inputs
from headprune.core.unit_kinds import KINDS
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.scoring.obs import obs_scores
from headprune.selection.reconstruct import reconstruct, shrunk_projections

DECODERS = [t for t in [*DECODER_CONFIGS, *LLAMA_LIKE_CONFIGS] if t != "olmo2"]  # OLMo 2 normalises across heads: gates only
ENCODERS = [name for name in FAMILY_MODELS if name != "deberta-v2 shared keys"]


def _model_and_batches(family: str, count: int = 2):
    """(a tiny random model of ``family``, ``count`` calibration batches with labels)."""
    if family in FAMILY_MODELS:
        make, batch = FAMILY_MODELS[family]
        text = family in ("distilbert", "deberta-v2")
        return make(), [classifier_batch(vocab=VOCAB, seed=s) if text else batch(seed=s) for s in range(count)]
    model = tiny_family(family, attn="eager" if family == "gemma2" else "sdpa")  # Gemma 2's soft-capping: no sdpa path
    return model, [lm_batch(seed=s, batch=4, length=10) for s in range(count)]


def _units(model) -> list[str]:
    """The joint units to price on ``model``: heads and neurons, with channels and with layers where the model allows them."""
    units = ["head+ffn"]
    units += ["head+ffn+hidden"] if KINDS["hidden"].available(model) is None else []
    units += ["ffn+layer"] if KINDS["layer"].available(model) is None else []
    return units


@pytest.mark.parametrize("family", DECODERS + ENCODERS)
def test_obs_fisher_prices_every_unit_of_every_kind(family):
    """obs_fisher gives every unit of every group a finite score >= 0, some above zero, on the family's tiny model."""
    model, batches = _model_and_batches(family)
    for unit in _units(model):
        gates = unit_gates(model, unit)
        scores = obs_scores(model, gates, batches, gates.unit, weighted=True)
        assert set(scores) == set(gates.groups), unit
        for group, values in scores.items():
            assert bool(torch.isfinite(values).all()) and bool((values >= 0).all()), (unit, group)
            assert bool((values > 0).any()), (unit, group)


@pytest.mark.parametrize("family", DECODERS + ENCODERS)
def test_masked_and_pruned_reconstruct_alike(family):
    """Heads and neurons removed at random: the masked model reconstructed on the pruned twin's projections computes what the
    pruned twin reconstructed computes, and reconstruction re-solved at least one projection."""
    model, batches = _model_and_batches(family, count=12)  # more tokens than the widest projection's inputs
    unit = "head+ffn"
    mask = random_half_mask(unit_gates(model, unit))
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, unit), mask)
    names = shrunk_projections(pruned, model)
    assert names
    target = reconstruct(pruned, model, batches)["target"]
    masked = copy.deepcopy(model)
    inputs = model_inputs(model, batches[0])
    with torch.no_grad(), unit_gates(masked, unit).masked(mask):
        reconstruct(masked, model, batches, projections=list(names), target=target)
        expected = masked(**inputs).logits
    with torch.no_grad():
        got = pruned(**inputs).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * float(expected.abs().max()))


@pytest.mark.parametrize("family", ["vit", "whisper"])
def test_too_few_image_or_audio_tokens_are_refused_before_work(family):
    """Without token ids the calibration tokens are the rows a layer reads: one example is too few, refused by name."""
    model, batches = _model_and_batches(family, count=1)
    one = {k: v[:1] if torch.is_tensor(v) else v for k, v in batches[0].items()}
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "head+ffn"), random_half_mask(unit_gates(model, "head+ffn")))
    with pytest.raises(ValueError, match="prune.recover_examples"):
        reconstruct(pruned, model, [one])


@pytest.mark.parametrize("family", ["vit", "deit", "whisper"])
def test_neurons_alone_are_compensated_without_token_ids(family):
    """Neurons only, on image or audio inputs (no token ids): reconstruction re-solves the down projections and leaves the
    teacher's outputs as they were, and the least-squares neuron fit runs and changes the pruned model's outputs."""
    from headprune.selection.lsq import unit_lsq_recoverer

    model, batches = _model_and_batches(family, count=12)
    assert "input_ids" not in batches[0]
    inputs = model_inputs(model, batches[0])
    with torch.no_grad():
        before = model(**inputs).logits
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "ffn"), random_half_mask(unit_gates(model, "ffn")))
    refit = copy.deepcopy(pruned)
    assert reconstruct(pruned, model, batches)["projections"] > 0
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, before, rtol=0, atol=0)
        plain = refit(**inputs).logits
        unit_lsq_recoverer("ffn")(refit, model, batches)
        assert float((refit(**inputs).logits - plain).abs().max()) > 1e-6 * float(plain.abs().max())


@pytest.mark.parametrize("family", ["vit", "deit", "whisper"])
def test_layers_alone_are_reconstructed_without_token_ids(family):
    """Layers only, on image or audio inputs: reconstruction counts the rows the first layer reads as its calibration
    tokens (no projection shrank to name one) and folds each removed layer where it can."""
    model, batches = _model_and_batches(family, count=12)
    if KINDS["layer"].available(model) is not None:
        pytest.skip(KINDS["layer"].available(model))
    gates = unit_gates(model, "layer")
    mask = {group: torch.ones_like(values) for group, values in gates.ones().items()}
    first = next(iter(mask))
    mask[first].view(-1)[-1] = 0  # the last layer of the first group removed
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "layer"), mask)
    report = reconstruct(pruned, model, batches)
    rows = sum(int(b[next(iter(b))].shape[0]) for b in batches)  # at least one token an example
    assert report["tokens"] >= rows and report["layers_folded"]
