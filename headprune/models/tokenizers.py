"""Joint subword tokenizers for translation: train one (HF ``tokenizers``) or load a saved/pretrained one."""

from collections.abc import Iterable
from pathlib import Path

from headprune.models.sources import VOCABULARY_FILES, has_tokenizer, resolve_pretrained, split_revision  # noqa: F401 (re-exported)

PAD, EOS, UNK, BOS = "<pad>", "</s>", "<unk>", "<s>"
SPECIALS = [PAD, EOS, UNK, BOS]  # ids 0..3 in every tokenizer we train


def train_tokenizer(texts: Iterable[str], vocab_size: int = 8000, kind: str = "bpe", min_frequency: int = 2):
    """Train a joint subword tokenizer (``bpe``: byte-level BPE, ``unigram``: Metaspace unigram) on ``texts``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    texts = list(texts)
    if kind == "bpe":
        tok = Tokenizer(models.BPE(unk_token=UNK))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=SPECIALS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        tok.decoder = decoders.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, unk_token=UNK, show_progress=False)
    else:
        raise ValueError(f"tokenizer kind must be 'bpe' or 'unigram', got {kind!r}")
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    eos_id = tok.token_to_id(EOS)
    tok.post_processor = processors.TemplateProcessing(single=f"$A {EOS}", pair=f"$A {EOS} $B {EOS}", special_tokens=[(EOS, eos_id)])
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS, unk_token=UNK, bos_token=BOS)


def load_tokenizer(path: str | Path):
    """A tokenizer saved by ``save_pretrained`` (ours or a pretrained model's), from a directory or the hub."""
    from transformers import AutoTokenizer

    name, revision = split_revision(resolve_pretrained(str(path), "tokenizer"))
    return AutoTokenizer.from_pretrained(name, revision=revision)


def special_ids(tokenizer) -> dict[str, int]:
    """pad/eos/bos/decoder-start ids for a seq2seq config built around ``tokenizer`` (Marian convention: start = pad)."""
    pad, eos = tokenizer.pad_token_id, tokenizer.eos_token_id
    if pad is None or eos is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} needs a pad and an eos token for translation")
    bos = tokenizer.bos_token_id
    return {"pad_token_id": pad, "eos_token_id": eos, "bos_token_id": bos, "decoder_start_token_id": pad, "forced_eos_token_id": eos}


def encode(tokenizer, texts: list[str], max_len: int | None = None, target: bool = False) -> list[list[int]]:
    """Token ids (ending in eos) for each text; truncated to ``max_len`` keeping the final eos."""
    if not texts:
        return []
    out = tokenizer(text_target=texts)["input_ids"] if target else tokenizer(texts)["input_ids"]
    if max_len:
        eos = tokenizer.eos_token_id
        out = [ids if len(ids) <= max_len else ids[: max_len - 1] + [eos] for ids in out]
    return out


def decode(tokenizer, ids) -> list[str]:
    """Detokenized strings (special tokens dropped, surrounding spaces stripped)."""
    return [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
