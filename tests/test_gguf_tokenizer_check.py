"""The llama.cpp client check's tokenizer row: llama.cpp's ids of probe texts against the tokenizer's, a prefix space the
tokenizer adds (and llama.cpp's BPE never does) said apart from any other difference; no llama.cpp needed (a fake split)."""

from __future__ import annotations

import copy

import torch

from headprune.export.client_check import adds_prefix_space, probe_texts
from headprune.export.llamacpp_client import tokenizer_rows

TEXTS = [f"the {w} sat on the {v} mat" for w in ("cat", "dog") for v in ("red", "blue")]


def _trained():
    from headprune.models.tokenizers import train_tokenizer

    return train_tokenizer(TEXTS * 10, vocab_size=300)


def _without_prefix_space(tokenizer):
    from tokenizers import pre_tokenizers

    plain = copy.deepcopy(tokenizer)
    plain.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    return plain


def _split_without_prefix(tokenizer):
    """What llama.cpp's gpt-2 pre-tokenizer does with this vocabulary: the tokenizer's split without the added space."""
    plain = _without_prefix_space(tokenizer)
    return lambda text: plain(text, add_special_tokens=False)["input_ids"]


def test_a_trained_tokenizer_adds_a_prefix_space_and_a_plain_one_does_not():
    tokenizer = _trained()
    assert adds_prefix_space(tokenizer) and not adds_prefix_space(_without_prefix_space(tokenizer))
    probe = probe_texts(tokenizer, torch.tensor([tokenizer("the cat sat")["input_ids"]]))
    assert len(probe["texts"]) == len(probe["text_ids"]) == len(probe["spaced_ids"]) == 2
    assert "spaced_ids" not in probe_texts(_without_prefix_space(tokenizer), torch.tensor([[5, 6]]))


def test_the_row_passes_equal_ids_says_a_prefix_space_and_fails_other_splits():
    tokenizer = _trained()
    probe = probe_texts(tokenizer, torch.tensor([tokenizer("the cat sat")["input_ids"]]))
    job = {"name": "f", **probe}
    same = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    assert tokenizer_rows(job, same)[0][1] is True
    _, passed, detail = tokenizer_rows(job, _split_without_prefix(tokenizer))[0]
    assert passed is None and "alike once a space leads the text" in detail
    by_bytes = lambda text: list(text.encode("utf-8"))  # noqa: E731  (another split altogether)
    _, passed, detail = tokenizer_rows(job, by_bytes)[0]
    assert passed is False and "llama.cpp [" in detail
    no_space = {k: v for k, v in job.items() if k != "spaced_ids"}  # a tokenizer without the prefix space: any difference fails
    assert tokenizer_rows(no_space, _split_without_prefix(tokenizer))[0][1] is False
    assert tokenizer_rows({"name": "f"}, same) == []
