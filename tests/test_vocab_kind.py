"""The vocab kind: masked == pruned on kept ids, save / load with the rewritten tokenizer, and the rewritten tokenizers."""

from __future__ import annotations

import copy
import random

import pytest
import torch
from tiny_llms import DECODER_CONFIGS, tiny_family

from headprune.core.checks import ConfigError
from headprune.core.counting import model_cost
from headprune.core.kinds import KINDS
from headprune.core.saving import load_pruned, save_pruned
from headprune.core.units import PrunedCount, prune_unit_mask, unit_gates
from headprune.core.vocab.rows import id_map
from headprune.core.vocab.tokenizer import floor_ids, rewritten_tokenizer, tokenizer_json
from headprune.models.tokenizers import train_tokenizer

WORDS = "the cat sat on a mat while dogs ran far away from home and birds sang songs of old".split()
CHARS = "abcdefghijklmnopqrstuvwxyz ,.!?éß€0123456789\n"


def _texts(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(n)]


@pytest.fixture(scope="module")
def bpe():
    return train_tokenizer(_texts(), vocab_size=300, kind="bpe")


def _llama(vocab: int, tie: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3, tie_word_embeddings=tie,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _mask(tokenizer, vocab: int, seed: int = 0) -> tuple[dict, list[int]]:
    """A vocab mask removing half of the tokens above the floor, and the removed ids."""
    floor = set(floor_ids(tokenizer))
    free = [i for i in range(vocab) if i not in floor]
    removed = sorted(random.Random(seed).sample(free, len(free) // 2))
    row = torch.ones(1, vocab)
    row[0, removed] = 0
    return {"vocab": row}, removed


@pytest.mark.parametrize("tie", [False, True])
def test_masked_equals_pruned_on_kept_ids(bpe, tie):
    model = _llama(len(bpe), tie)
    mask, removed = _mask(bpe, len(bpe))
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "vocab"), mask)
    kept = [i for i in range(len(bpe)) if i not in set(removed)]
    assert pruned.config.vocab_size == len(kept) == pruned.get_input_embeddings().num_embeddings
    assert pruned.lm_head.out_features == len(kept)
    assert (pruned.lm_head.weight is pruned.get_input_embeddings().weight) == tie
    text_ids = torch.tensor([kept[::7][:12], kept[-12:]])  # text that avoids removed tokens
    with torch.no_grad(), unit_gates(model, "vocab").masked(mask):
        masked = model(input_ids=text_ids).logits
    with torch.no_grad():
        viewed = pruned(input_ids=text_ids).logits  # the id view: original ids in and out
        assert (viewed - masked).abs().max() <= 1e-5 * masked.abs().max()
        mapping = id_map(pruned)
        site = unit_gates(pruned, "vocab").sites[0]
        view, site.old_to_new = site.old_to_new, None  # the bare pruned model: new ids in, new ids out
        bare = pruned(input_ids=text_ids.apply_(mapping.get)).logits
        site.old_to_new = view
    assert (bare - masked[..., kept]).abs().max() <= 1e-5 * masked.abs().max()


def test_flops_prediction_equals_the_pruned_models_count(bpe):
    model = _llama(len(bpe))
    mask, removed = _mask(bpe, len(bpe))
    table = unit_gates(model, "vocab")
    tables = KINDS["vocab"].flops_tables(model, 16)
    full = model_cost(model, 16).flops
    predicted = full - float(tables["vocab"][0, len(bpe)] - tables["vocab"][0, len(bpe) - len(removed)])
    assert PrunedCount(model, "vocab", 16)(mask) == predicted
    assert table.groups == {"vocab": (1, len(bpe))}


def test_save_and_load_ship_the_rewritten_tokenizer(bpe, tmp_path):
    from transformers import AutoTokenizer

    model = _llama(len(bpe))
    mask, removed = _mask(bpe, len(bpe))
    prune_unit_mask(unit_gates(model, "vocab"), mask)
    save_pruned(model, tmp_path, tokenizer=bpe)
    assert model.config.eos_token_id == 3  # the model in memory still speaks original ids
    loaded, tokenizer = load_pruned(tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    mapping = id_map(model)
    assert loaded.config.vocab_size == len(tokenizer) == len(mapping)
    assert loaded.config.eos_token_id == mapping[3] and tokenizer.eos_token_id == mapping[bpe.eos_token_id]
    text = "the cat sat far away"
    new_ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        site = unit_gates(model, "vocab").sites[0]
        view, site.old_to_new = site.old_to_new, None
        expected = model(input_ids=new_ids).logits
        site.old_to_new = view
        torch.testing.assert_close(loaded(input_ids=new_ids).logits, expected)


def _random_text(rng: random.Random) -> str:
    return "".join(rng.choice(CHARS) if rng.random() < 0.5 else rng.choice(WORDS) + " " for _ in range(rng.randint(1, 20)))


def test_rewritten_bpe_never_emits_a_removed_id_and_round_trips(bpe):
    mask, removed = _mask(bpe, len(bpe), seed=1)
    kept = [i for i, keep in enumerate(mask["vocab"][0].tolist()) if keep]
    rewritten = rewritten_tokenizer(bpe, kept)
    assert len(rewritten) == len(kept)
    merges = lambda t: len(tokenizer_json(t)["model"]["merges"])  # noqa: E731
    assert 0 < merges(rewritten) < merges(bpe)
    rng = random.Random(0)
    for _ in range(200):
        text = _random_text(rng)
        ids = rewritten(text)["input_ids"]
        assert max(ids) < len(kept)
        assert rewritten.decode(ids, skip_special_tokens=True) == bpe.decode(bpe(text)["input_ids"], skip_special_tokens=True)
        original = [kept[i] for i in ids]  # back to original ids: none removed
        assert not set(original) & set(removed)


def test_rewritten_wordpiece_falls_back_to_kept_pieces():
    from transformers import AutoTokenizer

    from headprune.models.sources import resolve_pretrained

    wordpiece = AutoTokenizer.from_pretrained(resolve_pretrained("minilm"))
    floor = set(floor_ids(wordpiece))
    rng = random.Random(0)
    removed = set(rng.sample([i for i in range(len(wordpiece)) if i not in floor], len(wordpiece) // 2))
    kept = [i for i in range(len(wordpiece)) if i not in removed]
    rewritten = rewritten_tokenizer(wordpiece, kept)
    for _ in range(100):
        text = _random_text(rng)
        ids = rewritten(text)["input_ids"]
        assert not {kept[i] for i in ids} & removed
        assert rewritten.decode(ids, skip_special_tokens=True).replace(" ", "") == wordpiece.decode(
            wordpiece(text)["input_ids"], skip_special_tokens=True
        ).replace(" ", "")  # kept sub-pieces spell the same characters (no [UNK] where the original had none)


def test_bad_inputs_are_refused_in_one_line(bpe):
    unigram = train_tokenizer(_texts(), vocab_size=120, kind="unigram")
    with pytest.raises(ConfigError, match="Unigram"):
        floor_ids(unigram)
    small = train_tokenizer(_texts(), vocab_size=200, kind="bpe")  # 256 byte tokens: the floor is every token

    with pytest.raises(ConfigError, match="none can be removed"):
        KINDS["vocab"].floor(unit_gates(_llama(len(small)), "vocab"), small, [])
    with pytest.raises(ConfigError, match="model's own tokenizer"):
        KINDS["vocab"].floor(unit_gates(_llama(100), "vocab"), bpe, [])


@pytest.mark.parametrize("family", list(DECODER_CONFIGS))
def test_masked_equals_pruned_on_every_decoder_family(family):
    """Token rows removed from each decoder family of the table (OLMo 2's norms across heads included): the pruned model's
    logits at kept ids are the masked model's, on text of kept ids."""
    model = tiny_family(family, attn="eager" if family == "gemma2" else "sdpa")
    vocab = model.config.vocab_size
    removed = sorted(random.Random(1).sample(range(4, vocab), (vocab - 4) // 2))  # the special ids below 4 stay
    mask = {"vocab": torch.ones(1, vocab)}
    mask["vocab"][0, removed] = 0
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "vocab"), mask)
    kept = [i for i in range(vocab) if i not in set(removed)]
    text_ids = torch.tensor([kept[::3][:10], kept[-10:]])
    with torch.no_grad(), unit_gates(model, "vocab").masked(mask):
        masked = model(input_ids=text_ids).logits
    with torch.no_grad():
        viewed = pruned(input_ids=text_ids).logits
    assert pruned.config.vocab_size == len(kept)
    assert (viewed[..., kept] - masked[..., kept]).abs().max() <= 1e-5 * masked.abs().max()
