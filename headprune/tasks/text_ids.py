"""The token ids a split's text uses (prune.vocab_text), counted over every example of the split and kept on the task."""

CACHE_ATTR = "_headprune_text_ids"  # {split: sorted token ids} on the task


def split_token_ids(task, split: str) -> list[int]:
    """The sorted ids of every token of ``split`` (the task's ``token_rows``: each example's ids, padding left out)."""
    cache = task.__dict__.setdefault(CACHE_ATTR, {})
    if split not in cache:
        seen: set[int] = set()
        for row in task.token_rows(split):
            seen.update(int(t) for t in row)
        cache[split] = sorted(seen)
    return cache[split]


def text_token_ids(task, splits) -> list[int]:
    """The sorted ids of every token the text of ``splits`` uses (none: [])."""
    return sorted({t for split in splits for t in split_token_ids(task, split)})
