"""Translation data: aligned-file checks, the synthetic language pair, the tokenizer, token batching."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

import headprune.tasks.mt.data as mt_data
from headprune.models.tokenizers import decode, encode, load_tokenizer, train_tokenizer
from headprune.tasks.mt.data import TokenBatches, TranslationDataModule, collate, token_batches
from headprune.tasks.mt.files import AlignmentError, read_aligned
from headprune.tasks.mt.synthetic import SyntheticTranslation, synthetic_splits


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_aligned_files_read_and_limit(tmp_path):
    _write(tmp_path / "train.en", ["a dog .", "two cats"])
    _write(tmp_path / "train.de", ["ein Hund .", "zwei Katzen"])
    assert read_aligned(tmp_path, "train", "en", "de") == (["a dog .", "two cats"], ["ein Hund .", "zwei Katzen"])


def test_unequal_line_counts_name_both_files(tmp_path):
    _write(tmp_path / "valid.en", ["a", "b", "c"])
    _write(tmp_path / "valid.de", ["a", "b"])
    with pytest.raises(AlignmentError) as err:
        read_aligned(tmp_path, "valid", "en", "de")
    message = str(err.value)
    assert "valid.en has 3 lines" in message and "valid.de has 2" in message and "line 3 of" in message


def test_empty_lines_give_file_and_line_numbers(tmp_path):
    _write(tmp_path / "test.en", ["a", "b", "c", "d"])
    _write(tmp_path / "test.de", ["a", "", "c", "  "])
    with pytest.raises(AlignmentError, match=r"test\.de has empty lines at line 2, 4"):
        read_aligned(tmp_path, "test", "en", "de")


def test_missing_split_lists_what_is_there(tmp_path):
    _write(tmp_path / "valid.de", ["x"])
    _write(tmp_path / "valid.en", ["x"])
    with pytest.raises(FileNotFoundError, match=r"train\.de.*files there: valid\.de, valid\.en"):
        read_aligned(tmp_path, "train", "de", "en")


def test_synthetic_pairs_are_deterministic_with_agreement_and_reordering():
    first = synthetic_splits({"train": 50, "valid": 10, "test": 10}, seed=3)
    again = synthetic_splits({"train": 50, "valid": 10, "test": 10}, seed=3)
    assert first == again
    assert synthetic_splits({"train": 50, "valid": 10, "test": 10}, seed=4)["train"] != first["train"]
    assert set(first["train"][0]).isdisjoint(first["test"][0])  # different streams per split
    lang = SyntheticTranslation(seed=3)
    lexicon = {s: (t, g) for s, t, g in lang.nouns}
    for src, tgt in zip(*first["train"]):
        s, t = src.split(), tgt.split()
        # subject: determiner (number) ... noun; target: determiner agreeing with the noun's target gender, then the noun
        noun = next(w for w in s[1:] if w in lexicon)
        stem, gender = lexicon[noun]
        number = "sg" if s[0] == "ta" else "pl"
        assert t[0] == lang.tgt_det[(gender, number)]
        assert t[1] == stem + ("en" if number == "pl" else "")
        assert t[-1][-2] == ("t" if number == "sg" else "n")  # the verb comes last (before ".") and agrees with the subject


def test_tokenizer_round_trip_and_reload(tmp_path):
    src, tgt = synthetic_splits({"train": 200, "valid": 1, "test": 1})["train"]
    texts = ["Zwei Männer, Straße.  done", "A dog's ball (red)!"] + src + tgt
    for kind in ("bpe", "unigram"):
        tok = train_tokenizer(texts, vocab_size=300, kind=kind, min_frequency=1)
        ids = encode(tok, texts[:20])
        assert all(seq[-1] == tok.eos_token_id for seq in ids)
        assert decode(tok, ids) == texts[:20]  # lossless: detokenized output is plain text
        tok.save_pretrained(tmp_path / kind)
        assert encode(load_tokenizer(tmp_path / kind), texts[:20]) == ids
    truncated = encode(tok, ["a b c d e f g h i j k l m n"], max_len=4)
    assert len(truncated[0]) == 4 and truncated[0][-1] == tok.eos_token_id


def test_token_batches_respect_budget_and_cover_everything():
    src = [3, 10, 5, 7, 2, 9, 4, 8, 6, 1] * 3
    tgt = [4, 9, 6, 7, 3, 8, 5, 8, 6, 2] * 3
    batches = token_batches(src, tgt, max_tokens=24, shuffle=True, seed=1)
    assert sorted(i for b in batches for i in b) == list(range(30))
    assert all(len(b) * max(max(src[i], tgt[i]) for i in b) <= 24 for b in batches)
    assert batches == token_batches(src, tgt, max_tokens=24, shuffle=True, seed=1)
    assert batches != token_batches(src, tgt, max_tokens=24, shuffle=True, seed=2)


def test_collate_shifts_targets_and_pads():
    batch = collate([[5, 6, 1], [7, 1]], [[8, 1], [9, 10, 11, 1]], pad_id=0, start_id=0, ids=[4, 2])
    assert batch["input_ids"].tolist() == [[5, 6, 1], [7, 1, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["labels"].tolist() == [[8, 1, -100, -100], [9, 10, 11, 1]]
    assert batch["decoder_input_ids"].tolist() == [[0, 8, 0, 0], [0, 9, 10, 11]]
    assert batch["ids"].tolist() == [4, 2]


def test_token_batches_shard_evenly_across_ranks(monkeypatch):
    src = [[5] * (1 + i % 7) for i in range(50)]
    data = TokenBatches(src, src, pad_id=0, start_id=0, max_tokens=20, shuffle=True, seed=0)
    seen = []
    for rank in range(3):
        monkeypatch.setattr(mt_data, "rank_and_world", lambda r=rank: (r, 3))
        shard = [b["ids"].tolist() for b in data]
        seen.append(shard)
    assert len({len(s) for s in seen}) == 1  # same number of steps on every rank (no DDP hang)
    flat = [i for shard in seen for b in shard for i in b]
    assert len(flat) == len(set(flat))
    data.set_epoch(1)
    monkeypatch.setattr(mt_data, "rank_and_world", lambda: (0, 1))
    assert [b["ids"].tolist() for b in data] != [b["ids"].tolist() for b in TokenBatches(src, src, 0, 0, 20, True, 0)]


def test_datamodule_files_source_trains_joint_tokenizer(tmp_path):
    src, tgt = synthetic_splits({"train": 120, "valid": 12, "test": 8})["train"]
    for split, n in (("train", 100), ("valid", 12), ("test", 8)):
        _write(tmp_path / f"{split}.xx", src[:n])
        _write(tmp_path / f"{split}.yy", tgt[:n])
    cfg = OmegaConf.load("conf/data/mt_defaults.yaml")
    cfg.merge_with(
        {
            "source": "files",
            "dir": str(tmp_path),
            "src_lang": "xx",
            "tgt_lang": "yy",
            "tokenizer": {"vocab_size": 200},
            "limits": {"train": 80},
            "importance": {"size": 10},
        }
    )
    data = TranslationDataModule(cfg, seed=0)
    data.setup("fit")
    assert len(data.split_texts("train")[0]) == 80
    tok = data.tokenizer
    assert decode(tok, data.split_encoded("valid")[1]) == tgt[:12]
    batches = data.eval_batches("test")
    assert sorted(i for b in batches for i in b["ids"].tolist()) == list(range(8))
    importance = data.importance_batches()
    assert sum(len(b["input_ids"]) for b in importance) == 10 and all("labels" in b for b in importance)


def test_eval_batches_shard_by_example(tmp_path):
    cfg = OmegaConf.load("conf/data/mt_defaults.yaml")
    cfg.merge_with(
        {"source": "synthetic", "synthetic": {"seed": 0, "sizes": {"train": 50, "valid": 5, "test": 5}}, "tokenizer": {"vocab_size": 200}}
    )
    data = TranslationDataModule(cfg, seed=0)
    shards = [[i for b in data.eval_batches("valid", rank=r, world=2) for i in b["ids"].tolist()] for r in range(2)]
    assert sorted(shards[0]) == [0, 2, 4] and sorted(shards[1]) == [1, 3]  # a one-batch split still feeds every rank


def test_hub_source_reads_both_row_layouts(monkeypatch):
    import datasets

    from headprune.tasks.mt import data as translation

    tables = {
        "wmt14": datasets.Dataset.from_dict({"translation": [{"en": "a cat", "fr": "un chat"}, {"en": "a dog", "fr": "un chien"}]}),
        "bentrevett/multi30k": datasets.Dataset.from_dict({"en": ["a cat", "a dog"], "de": ["eine Katze", "ein Hund"]}),
    }
    calls = []

    def fake_load(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return tables[path]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    cfg = OmegaConf.load("conf/data/mt_hub.yaml")
    cfg.merge_with(OmegaConf.load("conf/data/mt_defaults.yaml"))
    cfg.merge_with(
        {
            "source": "hub",
            "hub": {"path": "wmt14", "name": "fr-en"},
            "src_lang": "en",
            "tgt_lang": "fr",
            "splits": {"train": "train", "valid": "validation", "test": "test"},
        }
    )
    assert translation.load_texts(cfg, "valid") == (["a cat", "a dog"], ["un chat", "un chien"])
    cfg.merge_with({"hub": {"path": "bentrevett/multi30k", "name": None}, "tgt_lang": "de", "limits": {"test": 1}})
    assert translation.load_texts(cfg, "test") == (["a cat"], ["eine Katze"])
    assert calls == [("wmt14", "fr-en", "validation"), ("bentrevett/multi30k", None, "test")]
