"""The haystack: per split, a pool of filler sentences (one per line) that examples take consecutive runs of."""

from headprune.tasks.data_sources import hub_texts, listed_texts, split_files
from headprune.tasks.longctx.config import SPLITS, PasskeyConfig


class HaystackError(ValueError):
    """A haystack that cannot be read or holds no text, named with how to fix it."""


def local_pools(config: PasskeyConfig) -> dict[str, list[str]]:
    """{split: lines} of ``data.files`` under ``data.dir``; the eval split's files are no other split's."""
    overlap = "for eval and for another split: give the eval split its own files"
    files = split_files(config.files, SPLITS, ("eval",), "passkey", overlap, HaystackError)
    return {
        split: [
            line for name in files.get(split, ()) for line in listed_texts(config.raw, str(config.dir), split, name, "haystack text file")
        ]
        for split in config.splits
    }


def hub_pools(config: PasskeyConfig) -> dict[str, list[str]]:
    """{split: texts} of a Hugging Face dataset's ``text_field`` (``hub_splits``: {split: the dataset's split})."""
    splits = {split: (config.hub_splits or {}).get(split) for split in config.splits}
    for split, hub_split in splits.items():
        if hub_split is None:
            raise HaystackError(f"data.hub_splits names no dataset split for the {split} split: add data.hub_splits.{split}=<split>")
    return hub_texts(config.hub_path, config.hub_name, splits, config.text_field)


def synthetic_pools(config: PasskeyConfig) -> dict[str, list[str]]:
    """{split: sentences} of the synthetic language (lexicon ``synthetic.seed``), a sampling seed per split."""
    from headprune.tasks.mt.synthetic import SyntheticConfig, SyntheticTranslation

    language = SyntheticTranslation(SyntheticConfig(seed=config.synthetic_seed))
    return {split: language.pairs(config.synthetic_sentences, seed=f"passkey-{config.seed}-{split}")[1] for split in config.splits}


def repeat_pools(config: PasskeyConfig) -> dict[str, list[str]]:
    """{split: the ``repeat`` sentences}: every haystack cycles through them (Mohtashami & Jaggi's filler); keys still differ."""
    if config.repeat is None:
        raise HaystackError("data.source=repeat needs the haystack's sentences in data.repeat: give a list of sentences")
    return {split: list(config.repeat) for split in config.splits}


def haystack_pools(config: PasskeyConfig) -> dict[str, list[str]]:
    """{split: filler sentences} of the configured source; a HaystackError when a split's pool is empty."""
    readers = {"synthetic": synthetic_pools, "local": local_pools, "hub": hub_pools, "repeat": repeat_pools}
    if config.source not in readers:
        raise HaystackError(f"data.source must be one of synthetic, local, hub or repeat for the passkey task, got {config.source!r}")
    pools = readers[config.source](config)
    for split, lines in pools.items():
        if not lines:
            where = f"data.files.{split}={(config.files or {}).get(split)}" if config.source == "local" else f"data.source={config.source}"
            raise HaystackError(f"data={config.name}: the {split} haystack holds no text ({where}): give files with one text per line")
    return pools
