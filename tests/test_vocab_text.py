"""prune.vocab_text: the vocabulary cut to the tokens a task's training text uses (TextPruner's rule), above the floor."""

from __future__ import annotations

import torch
from experiment_helpers import make_cfg, results


def test_every_token_the_training_text_leaves_unused_is_removed(tmp_path):
    from hydra.utils import get_method

    from headprune.core.vocab.tokenizer import floor_ids
    from headprune.tasks import registry
    from headprune.validation import validate

    torch.set_num_threads(1)
    overrides = ["prune.unit=vocab", "prune.fractions=[0.99]", "prune.vocab_text=[train,importance]"]
    cfg = make_cfg(tmp_path, "prune", "nli", *overrides)
    validate(cfg)
    get_method(cfg.run)(cfg)
    steps = results(tmp_path)["results"]["orders"]["importance"]["steps"]
    kept = {i for i, keep in enumerate(steps[-1]["mask"]["vocab"][0]) if keep}
    task = registry.load_task(cfg)
    tokenizer, data = task.tokenizer, task._require_data()
    used = set()
    for split in ("train", "importance"):  # the raw pairs split again by the tokenizer: every token the text uses
        texts = data.dataset(split).texts
        encoded = tokenizer(texts["premise"], texts["hypothesis"], truncation=True, max_length=data.config.max_length)
        used.update(t for row in encoded["input_ids"] for t in row)
    assert kept == used | set(floor_ids(tokenizer))  # the NLI task needs no token beyond its text (labels are classes)
    assert len(kept) < len(tokenizer) // 2  # the synthetic text uses few of the 30522 tokens
