"""Merge-closed vocabulary cuts: every kept BPE token stays producible by the rewritten tokenizer, at any count kept."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from headprune.core.kinds import KINDS
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.core.vocab.merges import merge_closed_scores, merge_parts, produced_ids
from headprune.core.vocab.tokenizer import rewritten_tokenizer, tokenizer_json
from headprune.models.tokenizers import train_tokenizer
from headprune.selection.uniform import layout_masks

SYLLABLES = "ka to ri mu sen da lo pi ne ru ma shi ko ta ni".split()
FRACTIONS = [0.1, 0.3, 0.5, 0.7, 0.85]


@pytest.fixture(scope="module")
def bpe():
    rng = random.Random(0)
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(80)]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 9))) for _ in range(400)]
    return train_tokenizer(texts, vocab_size=480, kind="bpe")  # over 100 merges, words built four or five merges deep


def _llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, max_position_embeddings=64, pad_token_id=0, bos_token_id=2, eos_token_id=3,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _scores(vocab: int, seed: int, ties: bool) -> torch.Tensor:
    """[1, V] scores: random, or counts with many ties (most tokens unused, as a token count gives)."""
    generator = torch.Generator().manual_seed(seed)
    if ties:
        return torch.randint(0, 4, (1, vocab), generator=generator).float() * (torch.rand(1, vocab, generator=generator) < 0.3)
    return torch.rand(1, vocab, generator=generator)


def _masks(tokenizer, model, scores: torch.Tensor, closed: bool) -> list[dict]:
    """The vocab masks at FRACTIONS of the floor-fixed scores, re-ranked by the kind (``closed``) or not."""
    kind, gates = KINDS["vocab"], unit_gates(model, "vocab")
    fixed = kind.floor(gates, tokenizer, [])["vocab"]
    ranked = {"vocab": scores.masked_fill(fixed, float("inf"))}
    if closed:
        ranked = kind.ranked_scores(gates, tokenizer, ranked)
    return layout_masks(ranked, gates.groups, FRACTIONS)


def _kept(mask) -> list[int]:
    return [i for i, keep in enumerate(mask["vocab"][0].tolist()) if keep]


def test_merge_parts_find_the_tokens_the_tokenizer_itself_produces(bpe):
    data = tokenizer_json(bpe)
    parts, dead = merge_parts(data)
    added = {t["id"] for t in data["added_tokens"]}
    by_walk = set(range(len(bpe))) - dead  # every token a derivation reaches (and the added ones, matched whole)
    assert by_walk == set(produced_ids(bpe)) and len(parts) == len(data["model"]["merges"]) > 100
    inverse = {i: t for t, i in data["model"]["vocab"].items()}
    for token, (left, right) in parts.items():  # a token's parts spell it
        assert inverse[left] + inverse[right] == inverse[token] and token not in added


@pytest.mark.parametrize("ties", [False, True])
def test_every_kept_token_is_produced_by_the_rewritten_tokenizer(bpe, ties):
    model = _llama(len(bpe))
    removable = len(bpe) - len(KINDS["vocab"].floor(unit_gates(model, "vocab"), bpe, [])["vocab"].nonzero())
    for seed in range(3):
        scores = _scores(len(bpe), seed, ties)
        for fraction, mask in zip(FRACTIONS, _masks(bpe, model, scores, closed=True)):
            kept = _kept(mask)
            assert len(bpe) - len(kept) == int(fraction * len(bpe) + 1e-9) or len(bpe) - len(kept) == removable  # the count asked
            rewritten = rewritten_tokenizer(bpe, kept)
            assert len(produced_ids(rewritten)) == len(kept)  # no dead row


def test_without_the_merge_closure_kept_tokens_go_dead(bpe):
    model = _llama(len(bpe))
    masks = _masks(bpe, model, _scores(len(bpe), 0, ties=False), closed=False)
    dead = [len(_kept(m)) - len(produced_ids(rewritten_tokenizer(bpe, _kept(m)))) for m in masks]
    assert max(dead) > 0  # the test above would see it


def test_masked_equals_pruned_on_a_merge_closed_cut(bpe):
    model = _llama(len(bpe))
    mask = _masks(bpe, model, _scores(len(bpe), 1, ties=True), closed=True)[2]
    kept = _kept(mask)
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "vocab"), mask)
    assert pruned.config.vocab_size == len(kept)
    text = torch.tensor([kept[::5][:16], kept[-16:]])  # text of kept tokens only
    with torch.no_grad(), unit_gates(model, "vocab").masked(mask):
        masked = model(input_ids=text).logits
    with torch.no_grad():
        viewed = pruned(input_ids=text).logits  # the id view: original ids in and out
    assert (viewed - masked).abs().max() <= 1e-5 * masked.abs().max()


def test_the_closed_ranking_keeps_the_scores_order_where_parts_are_already_above():
    parts = {4: (0, 1), 5: (4, 2), 6: (3, 3)}  # 5 = (0 1) 2; 6 = 3 3
    scores = torch.tensor([9.0, 1.0, 2.0, 0.5, 3.0, 8.0, 7.0])
    ranked = merge_closed_scores(scores, parts, dead=set())
    order = sorted(range(7), key=lambda i: -float(ranked[i]))
    assert order == [0, 1, 4, 2, 5, 3, 6]  # 0 (9); 5 (8) brings 1 and 4 first, and 2; 6 (7) brings 3
    assert float(ranked[0]) == 9.0 and float(ranked[5]) <= 8.0 and float(ranked[6]) <= 7.0
    assert len(set(ranked.tolist())) == 7  # strict: any count of the top is closed
    dead = merge_closed_scores(scores, parts, dead={6})
    assert int(dead.argmin()) == 6  # a token no text produces goes first
