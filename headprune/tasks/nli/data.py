"""NLIDataModule: MNLI-style premise/hypothesis pairs from the HF hub, local files or a built-in synthetic set."""

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from headprune.tasks.common import padded
from headprune.tasks.nli.config import REQUIRED, SOURCES, SPLITS, NLIDataConfig  # noqa: F401 (re-exported)
from headprune.tasks.nli.files import NLIDataError, label_id, present_split_files, read_split


class TokenizedPairs(Dataset):
    """Tokenized premise/hypothesis pairs; items carry their index so results can be put back in order."""

    def __init__(self, encodings: dict[str, list], labels: list[int], texts: dict[str, list] | None = None):
        self.encodings = encodings
        self.labels = labels
        self.texts = texts or {}
        self.lengths = [len(ids) for ids in encodings["input_ids"]]

    def __len__(self) -> int:
        return len(self.labels)

    def split_again(self, split_row) -> "TokenizedPairs":
        """The same pairs, each row split again by ``split_row`` ((ids, token types or None) -> the same in other ids)."""
        enc = self.encodings
        types = enc.get("token_type_ids", [None] * len(enc["input_ids"]))
        rows = [split_row(ids, kinds) for ids, kinds in zip(enc["input_ids"], types)]
        out = {"input_ids": [ids for ids, _ in rows]}
        if "token_type_ids" in enc:
            out["token_type_ids"] = [kinds for _, kinds in rows]
        if "attention_mask" in enc:
            out["attention_mask"] = [[1] * len(ids) for ids, _ in rows]
        return TokenizedPairs(out, self.labels, self.texts)

    def __getitem__(self, i: int) -> dict:
        return {**{key: values[i] for key, values in self.encodings.items()}, "labels": self.labels[i], "idx": i}


class PadCollator:
    """Pad a list of items to the longest in the batch: tensors input_ids/attention_mask/token_type_ids (B, T), labels, idx."""

    def __init__(self, pad_id: int):
        self.pad_id = pad_id

    def __call__(self, items: list[dict]) -> dict[str, torch.Tensor]:
        batch = {}
        for key in items[0]:
            if key in ("labels", "idx"):
                batch[key] = torch.tensor([item[key] for item in items], dtype=torch.long)
                continue
            batch[key] = padded([item[key] for item in items], self.pad_id if key == "input_ids" else 0)
        if "attention_mask" not in batch:
            batch["attention_mask"] = (batch["input_ids"] != self.pad_id).long()
        return batch


class LengthGroupedSampler(DistributedSampler):
    """Shuffled batches of similar-length examples, sharded over ranks (one rank: all of them)."""

    def __init__(self, lengths: list[int], batch_size: int, num_replicas: int = 1, rank: int = 0, seed: int = 0, megabatch: int = 50):
        super().__init__(lengths, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)
        self.lengths = lengths
        self.batch_size = batch_size
        self.megabatch = megabatch  # num_samples, total_size: DistributedSampler's, every rank padded to the same count

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=gen).tolist()
        order += order[: self.total_size - len(order)]  # pad so every rank gets the same count
        global_batch = self.batch_size * self.num_replicas
        window = global_batch * self.megabatch
        batches = []
        for start in range(0, len(order), window):
            chunk = sorted(order[start : start + window], key=lambda i: -self.lengths[i])
            batches += [chunk[b : b + global_batch] for b in range(0, len(chunk), global_batch)]
        perm = torch.randperm(len(batches), generator=gen).tolist()
        return iter([i for b in perm for i in batches[b][self.rank :: self.num_replicas]])


def _select(examples: dict[str, list], indices: list[int]) -> dict[str, list]:
    return {key: [values[i] for i in indices] for key, values in examples.items()}


class NLIDataModule(L.LightningDataModule):
    """Premise/hypothesis pairs -> padded, length-grouped batches; see the module docstring for the splits."""

    def __init__(self, config: NLIDataConfig, tokenizer):
        super().__init__()
        self.config = config
        self.tokenizer = tokenizer
        self.collate = PadCollator(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0)
        self.datasets: dict[str, TokenizedPairs] = {}

    def read_raw(self) -> dict[str, dict[str, list]]:
        """{split: {"premise", "hypothesis", "label"}} from the configured source, before limits."""
        c = self.config
        if c.source == "synthetic":
            from headprune.tasks.nli.synthetic import synthetic_splits

            return synthetic_splits(**c.synthetic)
        if c.source == "hub":
            return self._read_hub()
        return {
            split: read_split(path, limit=c.limit_eval if split != "train" else None)
            for split, path in present_split_files(c.dir, c.files, SPLITS, REQUIRED)
        }

    def _read_hub(self) -> dict[str, dict[str, list]]:
        import datasets

        c = self.config
        raw = {}
        for split, hub_split in c.hub_splits.items():
            if not hub_split:
                continue
            try:
                data = datasets.load_dataset(c.hub_path, c.hub_name, split=hub_split)
            except Exception as err:  # noqa: BLE001 - re-raised with what was asked for
                if split not in REQUIRED:
                    continue
                raise NLIDataError(
                    f"could not load split {hub_split!r} of {c.hub_path}/{c.hub_name} from the HF hub "
                    f"(needs internet or a cache; data=nli_local reads local files): {err}"
                ) from err
            where = f"{c.hub_path}/{c.hub_name}[{hub_split}]"
            raw[split] = {
                "premise": list(data["premise"]),
                "hypothesis": list(data["hypothesis"]),
                "label": [label_id(int(v), f"{where} row {i}") for i, v in enumerate(data["label"])],
            }
        return raw

    def prepare_data(self) -> None:
        """Download the hub data once (on rank 0); local and synthetic data need nothing."""
        if self.config.source == "hub":
            self._read_hub()

    def setup(self, stage: str | None = None) -> None:
        """Read, split off the importance subset, apply limits and tokenize (once)."""
        if self.datasets:
            return
        c = self.config
        raw = self.read_raw()
        for split in REQUIRED:
            if split not in raw or not raw[split]["label"]:
                where = f" ({c.dir}/{c.files.get(split)}.*, data.files.{split})" if c.source == "local" else ""
                raise NLIDataError(f"the {split!r} split of the {c.source} NLI data is empty{where}: it needs labelled examples")
        train = raw.pop("train")
        n = len(train["label"])
        if c.importance_size > (n // 2 if c.importance_holdout else n):
            raise NLIDataError(
                f"data.importance_size={c.importance_size} is too large for {n} training examples "
                f"(at most {n // 2 if c.importance_holdout else n}{' with importance_holdout' if c.importance_holdout else ''})"
            )
        chosen = sorted(torch.randperm(n, generator=torch.Generator().manual_seed(c.seed))[: c.importance_size].tolist())
        taken = set(chosen)
        rest = [i for i in range(n) if i not in taken] if c.importance_holdout else list(range(n))
        splits = {"train": _select(train, rest[: c.limit_train]), "importance": _select(train, chosen)}
        splits.update({name: {key: values[: c.limit_eval] for key, values in examples.items()} for name, examples in raw.items()})
        self.datasets = {name: self._tokenize(examples) for name, examples in splits.items() if examples["label"] or name == "importance"}

    def _tokenize(self, examples: dict[str, list]) -> TokenizedPairs:
        if not examples["label"]:
            return TokenizedPairs({"input_ids": []}, [], examples)
        enc = self.tokenizer(examples["premise"], examples["hypothesis"], truncation=True, max_length=self.config.max_length)
        keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc]
        return TokenizedPairs({k: enc[k] for k in keys}, list(examples["label"]), examples)

    @property
    def eval_splits(self) -> list[str]:
        """The evaluation sets present: ``eval`` (matched) and, when there is one, ``eval_mismatched``."""
        self.setup()
        return [s for s in ("eval", "eval_mismatched") if s in self.datasets]

    @property
    def splits(self) -> list[str]:
        self.setup()
        return list(self.datasets)

    def dataset(self, split: str) -> TokenizedPairs:
        """The tokenized examples of one split."""
        self.setup()
        if split not in self.datasets:
            raise KeyError(f"no NLI split {split!r}; this data has {sorted(self.datasets)}")
        return self.datasets[split]

    def loader(self, split: str, batch_size: int | None = None) -> DataLoader:
        """A deterministic loader over one split (length-sorted batches, each with ``idx``), for evaluation."""
        data = self.dataset(split)
        size = batch_size or (self.config.importance_batch_size if split == "importance" else self.config.eval_batch_size)
        longest_first = sorted(range(len(data)), key=lambda i: (-data.lengths[i], i))  # deterministic, little padding
        return DataLoader(data, batch_size=size, sampler=longest_first, collate_fn=self.collate, num_workers=self.config.num_workers)

    def train_dataloader(self) -> DataLoader:
        data = self.dataset("train")
        world, rank = 1, 0
        if self.trainer is not None:
            world, rank = self.trainer.world_size, self.trainer.global_rank
        c = self.config
        if c.group_by_length:
            sampler = LengthGroupedSampler(data.lengths, c.batch_size, world, rank, seed=c.seed, megabatch=c.megabatch)
        else:
            sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=c.seed)
        return DataLoader(
            data,
            batch_size=c.batch_size,
            sampler=sampler,
            collate_fn=self.collate,
            num_workers=c.num_workers,
            persistent_workers=c.num_workers > 0,
        )

    def val_dataloader(self) -> list[DataLoader]:
        return [self.loader(split) for split in self.eval_splits]

    def describe(self) -> str:
        """Split sizes in one line."""
        self.setup()
        sizes = ", ".join(f"{name}={len(data)}" for name, data in self.datasets.items())
        return f"NLI data ({self.config.source}{': ' + str(self.config.dir) if self.config.source == 'local' else ''}): {sizes}"
