"""TranslationDataModule: parallel text from the HF hub, local aligned files or the synthetic task; token batching."""

import functools
import random

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from headprune.models.tokenizers import encode, has_tokenizer, load_tokenizer, train_tokenizer
from headprune.tasks.common import padded
from headprune.tasks.mt.config import SPLITS, split_limit, split_of  # noqa: F401 (split_of re-exported)


def load_texts(data_cfg, split: str) -> tuple[list[str], list[str]]:
    """(sources, targets) of one split ("train", "valid" or "test") from the configured source."""
    source = data_cfg.source
    limit = split_limit(data_cfg, split)
    if source == "synthetic":
        from headprune.tasks.mt.synthetic import synthetic_splits

        syn = data_cfg.synthetic
        sizes = {s: int(syn.sizes[s]) for s in SPLITS}
        lexicon = {k: v for k, v in syn.items() if k not in ("sizes", "seed")}
        src, tgt = synthetic_splits(sizes, seed=int(syn.seed), **lexicon)[split]
    elif source == "files":
        from headprune.tasks.mt.files import read_aligned

        src, tgt = read_aligned(data_cfg.dir, data_cfg.splits[split], data_cfg.src_lang, data_cfg.tgt_lang)
    elif source == "hub":
        src, tgt = _load_hub(data_cfg, split)
    else:
        raise ValueError(f"data.source must be synthetic, files or hub, got {source!r}")
    return src[:limit], tgt[:limit]  # limit None: all


def _load_hub(data_cfg, split: str) -> tuple[list[str], list[str]]:
    """A split of a hub dataset with rows {"translation": {lang: text}} (wmt14, iwslt2017) or {lang: text} (multi30k)."""
    from datasets import load_dataset

    from headprune.tasks.mt.files import check_aligned

    hub = data_cfg.hub
    options = {"trust_remote_code": hub.trust_remote_code} if hub.get("name") else {}
    ds = load_dataset(hub.path, hub.get("name"), split=data_cfg.splits[split], **options)
    src_lang, tgt_lang = data_cfg.src_lang, data_cfg.tgt_lang
    if "translation" in ds.column_names:
        src, tgt = [r[src_lang] for r in ds["translation"]], [r[tgt_lang] for r in ds["translation"]]
    else:
        src, tgt = list(ds[src_lang]), list(ds[tgt_lang])
    check_aligned(src, tgt, f"{hub.path}:{split}.{src_lang}", f"{hub.path}:{split}.{tgt_lang}")
    return src, tgt


def token_batches(src_lens, tgt_lens, max_tokens: int, shuffle: bool, seed: int = 0, max_sentences: int | None = None) -> list[list[int]]:
    """Index lists whose padded size ``len(batch) * longest`` stays within ``max_tokens``."""
    rng = random.Random(seed)
    order = list(range(len(src_lens)))
    if shuffle:
        rng.shuffle(order)
    order.sort(key=lambda i: (max(src_lens[i], tgt_lens[i]), src_lens[i]))
    batches, current, longest = [], [], 0
    for i in order:
        size = max(src_lens[i], tgt_lens[i])
        full = max(longest, size) * (len(current) + 1) > max_tokens or (max_sentences and len(current) >= max_sentences)
        if current and full:
            batches.append(current)
            current, longest = [], 0
        current.append(i)
        longest = max(longest, size)
    if current:
        batches.append(current)
    if shuffle:
        rng.shuffle(batches)
    return batches


def collate(src_ids: list[list[int]], tgt_ids: list[list[int]] | None, pad_id: int, start_id: int, ids=None) -> dict:
    """Padded model inputs: input_ids, attention_mask and (with targets) decoder_input_ids and labels (-100 = pad)."""
    batch = {"input_ids": padded(src_ids, pad_id), "attention_mask": padded([[1] * len(ids_) for ids_ in src_ids], 0)}
    if tgt_ids is not None:
        decoder_input_ids = padded([[start_id, *ids_[:-1]] for ids_ in tgt_ids], pad_id)  # teacher forcing: shifted right
        batch.update(decoder_input_ids=decoder_input_ids, labels=padded(tgt_ids, -100))
    if ids is not None:
        batch["ids"] = torch.tensor(ids, dtype=torch.long)
    return batch


def rank_and_world() -> tuple[int, int]:
    """(this process's rank, processes) under DDP; (0, 1) without it."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class TokenBatches(IterableDataset):
    """Token-count batches of an encoded split, reshuffled per epoch and sharded across DDP ranks."""

    def __init__(self, src, tgt, pad_id: int, start_id: int, max_tokens: int, shuffle: bool, seed: int = 0, max_sentences=None):
        self.src, self.tgt, self.pad_id, self.start_id = src, tgt, pad_id, start_id
        self.max_tokens, self.shuffle, self.seed, self.max_sentences = max_tokens, shuffle, seed, max_sentences
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def batches(self) -> list[list[int]]:
        src_lens, tgt_lens = [len(s) for s in self.src], [len(t) for t in self.tgt]
        all_batches = token_batches(src_lens, tgt_lens, self.max_tokens, self.shuffle, self.seed + self.epoch, self.max_sentences)
        rank, world = rank_and_world()
        if world > 1:
            usable = len(all_batches) - len(all_batches) % world if self.shuffle else len(all_batches)
            all_batches = all_batches[:usable][rank::world]
        return all_batches

    def __len__(self) -> int:
        return len(self.batches())

    def __iter__(self):
        for idx in self.batches():
            yield collate([self.src[i] for i in idx], [self.tgt[i] for i in idx], self.pad_id, self.start_id, ids=idx)


class TranslationDataModule(L.LightningDataModule):
    """Parallel text for one language pair, tokenized with a trained joint subword model or a pretrained tokenizer."""

    def __init__(self, data_cfg, tokenizer=None, seed: int = 0):
        super().__init__()
        self.cfg = data_cfg
        self.tokenizer = tokenizer
        self.seed = seed
        self.texts: dict[str, tuple[list[str], list[str]]] = {}
        self.encoded: dict[str, tuple[list[list[int]], list[list[int]]]] = {}

    def split_texts(self, split: str) -> tuple[list[str], list[str]]:
        """(sources, targets) of a split, loaded once."""
        if split not in self.texts:
            self.texts[split] = load_texts(self.cfg, split)
        return self.texts[split]

    def build_tokenizer(self):
        """The tokenizer: given, loaded from ``data.tokenizer.path``, or trained on the training split (joint)."""
        if self.tokenizer is not None:
            return self.tokenizer
        tok_cfg = self.cfg.tokenizer
        if tok_cfg.get("path") and has_tokenizer(tok_cfg.path):
            self.tokenizer = load_tokenizer(tok_cfg.path)
            return self.tokenizer
        src, tgt = self.split_texts("train")
        self.tokenizer = train_tokenizer(
            src + tgt, vocab_size=int(tok_cfg.vocab_size), kind=tok_cfg.kind, min_frequency=int(tok_cfg.min_frequency)
        )
        if tok_cfg.get("path"):
            self.tokenizer.save_pretrained(str(tok_cfg.path))
        return self.tokenizer

    def split_encoded(self, split: str) -> tuple[list[list[int]], list[list[int]]]:
        """Token ids of a split (sources after ``data.source_prefix``, and targets, end with eos; training pairs truncated to ``max_len``)."""
        if split not in self.encoded:
            tok = self.build_tokenizer()
            src, tgt = self.split_texts(split)
            prefix = self.cfg.get("source_prefix")
            src = [prefix + line for line in src] if prefix else src
            max_len = int(self.cfg.max_len) if split == "train" else None
            self.encoded[split] = (encode(tok, src, max_len), encode(tok, tgt, max_len, target=True))
        return self.encoded[split]

    @property
    def pad_id(self) -> int:
        return self.build_tokenizer().pad_token_id

    @property
    def start_id(self) -> int:
        return self.pad_id  # Marian convention: the decoder starts from pad

    def setup(self, stage: str | None = None) -> None:
        if self.cfg.source == "files":
            for split in SPLITS:  # every split's files read and checked before any training
                self.split_texts(split)
        self.build_tokenizer()
        if stage in (None, "fit"):
            self.split_encoded("train")
        self.split_encoded("valid")

    @functools.cached_property
    def train_set(self) -> TokenBatches:
        src, tgt = self.split_encoded("train")
        return TokenBatches(src, tgt, self.pad_id, self.start_id, int(self.cfg.max_tokens), shuffle=True, seed=self.seed)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=None, num_workers=int(self.cfg.num_workers))

    def eval_batches(self, split: str, with_targets: bool = True, rank: int = 0, world: int = 1) -> list[dict]:
        """Fixed, length-sorted batches of a split (examples ``rank::world``), each with ``ids`` = the example indices."""
        keep = list(range(len(self.split_encoded(split)[0])))[rank::world]
        return self._batches(split, keep, int(self.cfg.eval_max_tokens), int(self.cfg.eval_batch_size), with_targets)

    def _batches(self, split: str, keep: list[int], max_tokens: int, max_sentences=None, with_targets: bool = True) -> list[dict]:
        """Length-sorted batches of the examples ``keep`` of a split, each with ``ids`` = the example indices."""
        src, tgt = self.split_encoded(split)
        order = token_batches([len(src[i]) for i in keep], [len(tgt[i]) for i in keep], max_tokens, False, max_sentences=max_sentences)
        return [
            collate([src[i] for i in idx], [tgt[i] for i in idx] if with_targets else None, self.pad_id, self.start_id, ids=idx)
            for idx in ([keep[j] for j in batch] for batch in order)
        ]

    def val_dataloader(self):
        rank, world = rank_and_world()
        # each rank translates every world-th sentence; validation BLEU gathers the hypotheses by id
        return DataLoader(self.eval_batches("valid", rank=rank, world=world), batch_size=None, collate_fn=lambda b: b)

    def importance_batches(self) -> list[dict]:
        """Batches (with labels) of a fixed random subset of the *training* split, for head importance."""
        src, _ = self.split_encoded("train")
        size = min(int(self.cfg.importance.size), len(src))
        if size < 1:
            raise ValueError(
                f"the importance subset is empty (data.importance.size={self.cfg.importance.size}, {len(src)} training "
                "pairs): set data.importance.size to a number of training sentences, e.g. 2000"
            )
        chosen = sorted(random.Random(f"importance-{self.seed}").sample(range(len(src)), size))
        return self._batches("train", chosen, int(self.cfg.importance.max_tokens))

    def references(self, split: str) -> list[str]:
        return self.split_texts(split)[1]
