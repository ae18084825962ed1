"""The vocabulary kind on the passkey task: answers scored per row under per-row token gates, prompts and answers kept."""

from __future__ import annotations

import json
import math

import pytest
import torch
from experiment_helpers import compose_cfg

from headprune.engine.ablation_causal import label_stats, row_label_stats

PASSKEY = [
    "experiment=prune",
    "model=tiny_llama",
    "data=passkey_synthetic",
    "data.sizes.eval=8",
    "data.sizes.importance=6",
    "data.sizes.heldout=4",
    "data.sizes.train=6",
    "logger=none",
]


def test_row_label_stats_equal_label_stats():
    """The head run on each row's labelled positions gives the flat positions' NLL sums and misses."""
    torch.manual_seed(0)
    hidden, head = torch.randn(4, 9, 8), torch.nn.Linear(8, 30)
    labels = torch.full((4, 9), -100)
    labels[0, 6:] = torch.tensor([3, 7, 1])
    labels[2, 2:4] = torch.tensor([29, 0])
    labels[3, 8] = 5
    flat, rows = label_stats(hidden, labels, head), row_label_stats(hidden, labels, head)
    assert torch.allclose(rows, flat, rtol=1e-6, atol=1e-6 * float(flat.abs().max()))
    assert rows[1].abs().sum() == 0  # a row without labels adds nothing


def test_vocab_pruning_keeps_the_prompts_and_answers(tmp_path):
    """Tokens go by use, never one an example's prompt, needle or answer reads; the points score under per-row gates."""
    from headprune.experiments import prune
    from headprune.tasks.longctx.task import load_passkey_task

    torch.set_num_threads(1)
    cfg = compose_cfg(tmp_path, [*PASSKEY, "prune.unit=vocab", "prune.fractions=[0.9]"])
    needed = load_passkey_task(cfg).needed_token_ids()
    prune.run(cfg)
    step = json.loads((tmp_path / "results.json").read_text())["results"]["orders"]["importance"]["steps"][0]
    kept = torch.tensor(step["mask"]["vocab"]).flatten()
    assert step["units_removed"] > 0
    assert kept[needed].all(), "a prompt or answer token was removed"
    assert math.isfinite(step["score"])


def test_a_mask_removing_a_prompt_token_is_refused(tmp_path):
    """A vocabulary mask (here edited) that removes a token the task's prompts or answers read is refused by name."""
    from headprune.core.checks import ConfigError
    from headprune.experiments import prune, speed
    from headprune.tasks.longctx.task import load_passkey_task

    torch.set_num_threads(1)
    cfg = compose_cfg(tmp_path / "prune", [*PASSKEY, "prune.unit=vocab", "prune.fractions=[0.5]"])
    needed = load_passkey_task(cfg).needed_token_ids()
    prune.run(cfg)
    results = json.loads((tmp_path / "prune" / "results.json").read_text())
    results["results"]["orders"]["importance"]["steps"][0]["mask"]["vocab"][0][needed[-1]] = 0
    (tmp_path / "bad.json").write_text(json.dumps(results))
    bad = compose_cfg(tmp_path / "speed", [*PASSKEY[1:], "experiment=speed", f"speed.mask_file={tmp_path / 'bad.json'}"])
    with pytest.raises(
        ConfigError, match=rf"speed.mask_file: the mask removes 1 token\(s\) the passkey task's .* \(ids \[{needed[-1]}\]\)"
    ):
        speed.run(bad)
