"""GGUF files of a vocab-pruned Llama: the token list, merges, token types and special ids of the rewritten tokenizer, and
the embedding rows at the kept ids, read back with the gguf package."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from clients.cases import TRAINED_PRE, tiny_llama, vocab_row


@pytest.fixture(scope="module")
def vocab_file(tmp_path_factory):
    """(the GGUF reader of a tiny Llama with a third of its tokens beyond the floor removed, the rewritten tokenizer, kept ids, the model)."""
    from gguf import GGUFReader

    from headprune.core.units import prune_unit_mask, unit_gates
    from headprune.export import export_model
    from headprune.export.renumbering import renumbering

    torch.set_num_threads(1)
    model, tokenizer = tiny_llama()
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "vocab"), {"vocab": vocab_row(model, tokenizer)})
    ids = renumbering(pruned, tokenizer)
    ids.apply(pruned)
    written = export_model("gguf", pruned, ids.tokenizer, tmp_path_factory.mktemp("vocab_gguf"), {}, "f32", "tiny", TRAINED_PRE)
    return GGUFReader(str(written["files"][0])), ids.tokenizer, ids.kept, model


def _strings(reader, key: str) -> list[str]:
    field = reader.fields[key]
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _ints(reader, key: str) -> list[int]:
    field = reader.fields[key]
    return [int(field.parts[i][0]) for i in field.data]


def test_tokens_merges_and_types_are_the_rewritten_tokenizers(vocab_file):
    import json

    reader, tokenizer, kept, model = vocab_file
    assert len(kept) < model.config.vocab_size
    tokens = _strings(reader, "tokenizer.ggml.tokens")
    assert tokens == tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
    merges = json.loads(tokenizer.backend_tokenizer.to_str())["model"]["merges"]
    assert _strings(reader, "tokenizer.ggml.merges") == [m if isinstance(m, str) else " ".join(m) for m in merges]
    assert 0 < len(merges)
    control = [i for i, kind in enumerate(_ints(reader, "tokenizer.ggml.token_type")) if kind == 3]  # gguf.TokenType.CONTROL
    assert control == sorted(tokenizer.all_special_ids)


def test_special_ids_and_embedding_rows_are_renumbered(vocab_file):
    reader, tokenizer, kept, model = vocab_file
    for name in ("bos", "eos"):
        new = _ints(reader, f"tokenizer.ggml.{name}_token_id")[0]
        assert new == getattr(tokenizer, f"{name}_token_id") and kept[new] == getattr(model.config, f"{name}_token_id")
    assert _ints(reader, "llama.vocab_size")[0] == len(kept) == len(tokenizer)
    table = next(t for t in reader.tensors if t.name == "token_embd.weight")
    rows = np.asarray(table.data).reshape(len(kept), -1)
    assert np.array_equal(rows, model.model.embed_tokens.weight.detach().numpy()[kept])
