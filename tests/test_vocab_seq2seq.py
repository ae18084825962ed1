"""The vocab kind on encoder-decoder models: masked == pruned with BART / Marian's final_logits_bias, T5's tied head, saved and loaded."""

from __future__ import annotations

import copy

import pytest
import torch

from headprune.core.saving import load_pruned, save_pruned
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.core.vocab.generation import removed_token_processors
from headprune.core.vocab.rows import id_map, vocab_site

VOCAB = 96
REMOVED = list(range(40, 80))  # ids 0..3 (pad, bos, eos, unk) and the text's ids stay


def _model(family: str):
    """A tiny random encoder-decoder of ``family``, its final_logits_bias (where it has one) far from zero."""
    from transformers import BartConfig, BartForConditionalGeneration, MarianConfig, MarianMTModel, T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    small = dict(d_model=32, encoder_layers=1, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4)
    small |= dict(encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "t5":
        config = T5Config(vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=1, num_decoder_layers=2, num_heads=4)
        model = T5ForConditionalGeneration(config)
    elif family == "bart":
        model = BartForConditionalGeneration(BartConfig(vocab_size=VOCAB, decoder_start_token_id=2, **small))
    else:
        model = MarianMTModel(MarianConfig(vocab_size=VOCAB, decoder_start_token_id=0, share_encoder_decoder_embeddings=True, **small))
    if hasattr(model, "final_logits_bias"):
        model.final_logits_bias.normal_(0.0, 3.0, generator=torch.Generator().manual_seed(1))
    return model.eval()


def _mask() -> dict:
    row = torch.ones(1, VOCAB)
    row[0, REMOVED] = 0
    return {"vocab": row}


def _inputs():
    kept = [i for i in range(4, VOCAB) if i not in set(REMOVED)]
    source = torch.tensor([kept[:9], kept[-9:]])
    target = torch.tensor([[0, *kept[10:15]], [0, *kept[20:25]]])
    return source, target


def _logits(model, source, target):
    with torch.no_grad():
        return model(input_ids=source, decoder_input_ids=target).logits


@pytest.mark.parametrize("family", ["t5", "bart", "marian"])
def test_masked_equals_pruned_with_the_logits_bias(family):
    """Removed tokens take the bias with them: the masked model's logits equal the pruned model's, original ids in and out."""
    model = _model(family)
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "vocab"), _mask())
    kept = [i for i in range(VOCAB) if i not in set(REMOVED)]
    assert pruned.get_output_embeddings().out_features == len(kept) == pruned.config.vocab_size
    if family != "t5":
        assert pruned.final_logits_bias.shape == (1, len(kept))
    source, target = _inputs()
    with unit_gates(model, "vocab").masked(_mask()):
        masked = _logits(model, source, target)
    scale = masked.abs().max()
    assert masked[..., REMOVED].abs().max() == 0  # a removed token's logit is 0 with its bias, as the pruned model scatters it
    assert (_logits(pruned, source, target) - masked).abs().max() <= 1e-5 * scale
    site, mapping = vocab_site(pruned), id_map(pruned)
    view, site.old_to_new = site.old_to_new, None  # the bare pruned model: new ids in, logits over the kept ids out
    bare = _logits(pruned, source.clone().apply_(mapping.get), target.clone().apply_(mapping.get))
    site.old_to_new = view
    assert (bare - masked[..., kept]).abs().max() <= 1e-5 * scale


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_per_example_gates_take_each_rows_bias(family):
    """A [batch, 1, vocab] mask gates each example's logits and bias by its own row, as the one-row mask of that row does."""
    model = _model(family)
    source, target = _inputs()
    rows = torch.ones(2, 1, VOCAB)  # [batch, 1, vocabulary]: one mask per example
    rows[1, 0, REMOVED] = 0
    with unit_gates(model, "vocab").masked({"vocab": rows}):
        both = _logits(model, source, target)
    with unit_gates(model, "vocab").masked(_mask()):
        second = _logits(model, source[1:], target[1:])
    assert (both[1:] - second).abs().max() <= 1e-5 * second.abs().max()
    assert (both[:1] - _logits(model, source[:1], target[:1])).abs().max() <= 1e-5 * second.abs().max()


@pytest.mark.parametrize("family", ["bart", "marian"])
def test_saved_and_loaded_seq2seq_reads_its_new_ids(family, tmp_path):
    """save_pruned writes the sliced bias and the new sizes (Marian's decoder_vocab_size too); stock loading gives the same logits."""
    model = _model(family)
    prune_unit_mask(unit_gates(model, "vocab"), _mask())
    source, target = _inputs()
    mapping = id_map(model)
    new_source, new_target = source.clone().apply_(mapping.get), target.clone().apply_(mapping.get)
    site = vocab_site(model)
    view, site.old_to_new = site.old_to_new, None
    expected = _logits(model, new_source, new_target)
    site.old_to_new = view
    save_pruned(model, tmp_path / "pruned")
    loaded = load_pruned(tmp_path / "pruned").eval()
    assert loaded.config.vocab_size == VOCAB - len(REMOVED)
    assert getattr(loaded.config, "decoder_vocab_size", None) in (None, VOCAB - len(REMOVED))
    assert (_logits(loaded, new_source, new_target) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_greedy_generation_of_masked_and_pruned_marian_agrees():
    """Generation through the id view gives the masked model's tokens (a removed token is never more likely than under the mask)."""
    model = _model("marian")
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "vocab"), _mask())
    source, _ = _inputs()
    options = dict(max_new_tokens=8, num_beams=1, do_sample=False)
    with torch.no_grad(), unit_gates(model, "vocab").masked(_mask()):
        masked = model.generate(input_ids=source, **options)
    with torch.no_grad():
        assert torch.equal(pruned.generate(input_ids=source, **options), masked)


@pytest.mark.parametrize("per_example", [False, True])
def test_beam_search_of_the_masked_model_is_the_saved_models(per_example):
    """With the removed tokens' scores at -inf, beam search on the masked model (original ids) gives the bare pruned model's beams."""
    model = _model("marian")
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "vocab"), _mask())
    source, _ = _inputs()
    mapping = id_map(pruned)
    site = vocab_site(pruned)
    site.old_to_new = None  # the saved model: new ids in and out, no removed token left to emit
    options = dict(max_new_tokens=8, num_beams=3, do_sample=False, decoder_start_token_id=0)
    with torch.no_grad():
        bare = pruned.generate(input_ids=source.clone().apply_(mapping.get), **options)
    mask = {"vocab": _mask()["vocab"].expand(2, 1, VOCAB).clone()} if per_example else _mask()
    with torch.no_grad(), unit_gates(model, "vocab").masked(mask):
        masked = model.generate(input_ids=source, logits_processor=removed_token_processors(model), **options)
    assert torch.equal(masked.apply_(mapping.get), bare)


def test_no_processor_acts_on_a_model_whose_vocabulary_is_whole():
    """A model without a vocabulary site, or with nothing removed, generates as it would without the processor."""
    model = _model("marian")
    assert len(removed_token_processors(model)) == 0
    vocab_site(model)
    scores = torch.randn(2, VOCAB)
    assert torch.equal(removed_token_processors(model)[0](None, scores), scores)
