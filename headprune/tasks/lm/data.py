"""Texts for language modelling: local text files, a hub corpus or a synthetic language, per split."""

import copy
import random

import torch

from headprune.tasks.common import padded
from headprune.tasks.data_sources import hub_texts, listed_texts, read_texts, split_files  # noqa: F401 (read_texts re-exported)

SPLITS = ("eval", "eval_other", "importance", "heldout", "train")  # also the drawing order (see draw_splits)
EVAL_SPLITS = ("eval", "eval_other")


def draw_splits(lines: dict[str, list[tuple[object, str]]], cfg) -> dict[str, list[str]]:
    """{split: ``data.limits.<split>`` texts (null: all) of its pool, drawn by ``data.seed`` in SPLITS order, in file order}; an evaluated local text is in no other."""
    limits, seed, exclude_evaluated = dict(cfg.get("limits") or {}), int(cfg.seed), cfg.get("source") == "local"
    taken, evaluated, out = set(), set(), {}
    for split in [s for s in SPLITS if s in lines] + [s for s in lines if s not in SPLITS]:
        drawn = [
            (key, text)
            for key, text in lines[split]
            if key not in taken and (split in EVAL_SPLITS or not exclude_evaluated or text not in evaluated)
        ]
        limit = limits.get(split)
        if limit is not None and limit < len(drawn):
            if limit <= 0:
                raise ValueError(f"data.limits.{split} must be a positive number of texts or null, got {limit}")
            drawn = [drawn[i] for i in sorted(random.Random(f"{seed}-{split}").sample(range(len(drawn)), limit))]
        taken.update(key for key, _ in drawn)
        if split in EVAL_SPLITS:
            evaluated.update(text for _, text in drawn)
        out[split] = [text for _, text in drawn]
    return out


def synthetic_texts(cfg) -> dict[str, list[str]]:
    """{split: texts} in the synthetic target language of headprune.tasks.mt.synthetic (agreement needs attention)."""
    from headprune.tasks.mt.synthetic import synthetic_splits

    pairs = synthetic_splits({split: int(n) for split, n in dict(cfg.synthetic.sizes).items()}, seed=int(cfg.synthetic.seed))
    return {split: targets for split, (_, targets) in pairs.items()}


def text_pools(cfg) -> dict[str, list[tuple[object, str]]]:
    """{split: [(key, text)]} of a data config before any draw; a local text's key is (file, line number), another's (split, index)."""
    source = cfg.get("source")
    if source == "local":
        overlap = "for evaluation and for importance/held-out choices or training: keep them apart"
        files = split_files(cfg.files, SPLITS, EVAL_SPLITS, "language-modelling", overlap)  # {split: [paths under the data dir]}
        lines = {
            split: [((path, number), text) for path in paths for number, text in enumerate(listed_texts(cfg, cfg.dir, split, path))]
            for split, paths in files.items()
        }
    elif source in ("hub", "synthetic"):
        hub = source == "hub"
        texts = hub_texts(cfg.hub_path, cfg.get("hub_name"), dict(cfg.hub_splits), cfg.text_field) if hub else synthetic_texts(cfg)
        lines = {split: [((split, i), text) for i, text in enumerate(split_texts)] for split, split_texts in texts.items()}
    else:
        raise ValueError(f"data.source must be local, hub or synthetic for language modelling, got {source!r}")
    if "eval" not in lines or "importance" not in lines:
        raise ValueError(f"language-modelling data needs an eval and an importance split, got {sorted(lines)}")
    return lines


def load_texts(cfg) -> dict[str, list[str]]:
    """{split: texts} for a data config (``source``: local, hub or synthetic), limited per ``cfg.limits``, splits disjoint."""
    return draw_splits(text_pools(cfg), cfg)


def join_documents(items: list[tuple[object, str]], lengths: list[int], tokens: int) -> list[tuple[object, str]]:
    """Consecutive texts of one source joined into documents of at least ``tokens`` tokens (a short tail left out), keyed by the first."""
    out, key, parts, held, source = [], None, [], 0, object()
    for (item_key, text), length in zip(items, lengths):
        if item_key[0] != source:  # a new file (or split): what the last one left is no document
            key, parts, held, source = None, [], 0, item_key[0]
        key = item_key if not parts else key
        parts.append(text)
        held += length
        if held >= tokens:
            out.append((key, "\n".join(parts)))
            parts, held = [], 0
    return out


def long_documents(cfg, pools: dict[str, list[tuple[object, str]]], tokenizer) -> dict[str, list[str]]:
    """{split: documents} of ``data.document_tokens`` tokens or more, drawn as texts are (``data.limits`` counts documents)."""
    tokens = int(cfg.document_tokens)
    documents = {}
    for split, items in pools.items():
        lengths = [len(ids) for ids in tokenizer([text for _, text in items], add_special_tokens=False)["input_ids"]] if items else []
        documents[split] = join_documents(items, lengths, tokens)
    return draw_splits(documents, cfg)


def encode_texts(
    tokenizer, texts: list[str], max_length: int, add_bos: bool = True, add_eos: bool = False, bos_id: int | None = None
) -> list[list[int]]:
    """Token ids of each text (``bos_id`` or the tokenizer's BOS first when asked), truncated to ``max_length``."""
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    bos_id = bos_id if bos_id is not None else tokenizer.bos_token_id
    bos = [bos_id] if add_bos and bos_id is not None else []
    eos = [tokenizer.eos_token_id] if add_eos and tokenizer.eos_token_id is not None else []
    return [(bos + x + eos)[:max_length] for x in ids]


def collate(sequences: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``/``attention_mask`` and next-token ``labels`` aligned with the logits."""
    return {
        "input_ids": padded(sequences, pad_id),
        "attention_mask": padded([[1] * len(seq) for seq in sequences], 0),
        "labels": padded([[*seq[1:], -100] for seq in sequences], -100),  # (B, T): the token after each position
    }


class SplitRows:
    """Rows per split (``rows``: each a sequence of token ids) and their batches, made by the subclass's ``collate_rows``."""

    what = "language-modelling"  # the data's name in errors

    def split(self, name: str) -> list:
        """The rows of a split, with an error that lists the splits."""
        if name not in self.rows:
            raise KeyError(f"no {self.what} split {name!r}; this data has {sorted(self.rows)}")
        return self.rows[name]

    def batches(self, split: str, batch_size: int | None = None, **options) -> list[dict[str, torch.Tensor]]:
        """Batches of a split, longest rows first (little padding); ``idx`` gives each row's position."""
        rows = self.split(split)
        size = int(batch_size or self.eval_batch_size)
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i]))
        chunks = [order[start : start + size] for start in range(0, len(order), size)]
        return [{**self.collate_rows([rows[i] for i in at], **options), "idx": torch.tensor(at, dtype=torch.long)} for at in chunks]


class LMData(SplitRows):
    """Tokenized texts per split and their batches (sorted by length, ``idx`` = position in the split)."""

    def __init__(
        self,
        texts: dict[str, list[str]],
        tokenizer,
        max_length: int = 128,
        batch_size: int = 16,
        eval_batch_size: int = 32,
        add_bos: bool = True,
        add_eos: bool = False,
        bos_id: int | None = None,
    ):
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is None:
            raise ValueError(f"tokenizer {type(tokenizer).__name__} has neither a pad nor an eos token to pad batches with")
        self.tokenizer = tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.batch_size, self.eval_batch_size = int(batch_size), int(eval_batch_size)
        self.texts, self.rows = {}, {}
        for split, split_texts in texts.items():
            encoded = encode_texts(tokenizer, split_texts, int(max_length), add_bos, add_eos, bos_id)
            kept = [i for i, ids in enumerate(encoded) if len(ids) >= 2]  # a text needs one predicted token
            self.texts[split] = [split_texts[i] for i in kept]
            self.rows[split] = [encoded[i] for i in kept]

    def split_again(self, split_row, tokenizer, splits: list[str]) -> "LMData":
        """A copy holding ``splits`` only, each row's text split again by ``split_row`` (ids -> ``tokenizer``'s ids, types)."""
        other = copy.copy(self)
        other.__dict__.pop("_scored_bytes", None)  # bytes are counted on the copy's rows, decoded by its tokenizer
        other.tokenizer = tokenizer
        other.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        other.texts = {split: self.texts[split] for split in splits}
        other.rows = {split: [split_row(row)[0] for row in self.split(split)] for split in splits}
        return other

    def collate_rows(self, rows: list[list[int]]) -> dict[str, torch.Tensor]:
        """One batch of token-id rows (padded, next-token labels)."""
        return collate(rows, self.pad_id)

    def scored_bytes(self, split: str) -> list[int]:
        """UTF-8 bytes of the text each row's scored tokens (all but the first) decode to: what bits per byte divide by."""
        cache = self.__dict__.setdefault("_scored_bytes", {})
        if split not in cache:
            decode = lambda ids: self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)  # noqa: E731
            cache[split] = [len(decode(ids[1:]).encode("utf-8")) for ids in self.split(split)]
        return cache[split]

    def split_summary(self) -> dict[str, dict[str, int]]:
        """{split: {"examples" (texts), "tokens" (BOS included, after truncation), "predicted_tokens"}}."""
        return {
            split: {"examples": len(ids), "tokens": sum(map(len, ids)), "predicted_tokens": sum(len(x) - 1 for x in ids)}
            for split, ids in self.rows.items()
        }
