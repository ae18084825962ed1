"""Paired bootstrap (accuracy and sacrebleu BLEU) and the greedy pruning orders."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headprune.scoring.significance import paired_bootstrap_accuracy, paired_bootstrap_bleu
from headprune.selection.greedy import (
    check_fractions,
    check_groups,
    fraction_grid,
    greedy_mask,
    random_scores,
    ranked_heads,
)
from headprune.selection.uniform import layout_masks
from headprune.sources.orders import check_order


def test_accuracy_bootstrap():
    rng = np.random.default_rng(0)
    base = rng.random(500) < 0.8
    worse = base.copy()
    worse[:60] = False
    noise = base.copy()
    noise[[3, 7]] = ~noise[[3, 7]]
    res = paired_bootstrap_accuracy(base, [base, worse, noise], n_samples=1000, seed=1)
    same, bad, small = res
    assert same.delta == 0 and same.p_value == 1.0 and not same.significant
    assert bad.delta < 0 and bad.p_value < 0.01 and bad.significant and bad.ci_high < 0
    assert not small.significant
    again = paired_bootstrap_accuracy(base, [worse, noise], n_samples=1000, seed=1)
    assert [r.p_value for r in again] == [bad.p_value, small.p_value]  # seedable


def test_bleu_bootstrap_is_sacrebleus():
    from sacrebleu.metrics import BLEU
    from sacrebleu.significance import PairedTest

    refs = [f"the {a} cat sat on the {b} mat" for a in ("red", "big", "old") for b in ("blue", "small", "new", "dirty")] * 5
    hyps = [r.replace("cat", "dog") if i % 2 else r for i, r in enumerate(refs)]
    same, changed = paired_bootstrap_bleu(refs, [refs, hyps], refs, n_samples=200, seed=7)
    assert same.p_value == 1.0 and not same.significant
    assert changed.delta < 0 and changed.significant
    import os

    os.environ["SACREBLEU_SEED"] = "7"
    try:
        _, direct = PairedTest([("b", refs), ("s", hyps)], {"BLEU": BLEU()}, [refs], test_type="bs", n_samples=200)()
    finally:
        del os.environ["SACREBLEU_SEED"]
    assert direct["BLEU"][1].p_value == pytest.approx(changed.p_value)


def test_fraction_and_order_checks():
    assert fraction_grid(0.1) == [round(0.1 * i, 6) for i in range(10)]
    assert fraction_grid(0.25) == [0.0, 0.25, 0.5, 0.75]
    for bad in (1.0, -0.01, float("nan")):
        with pytest.raises(ValueError, match=r"outside \[0, 1\)"):
            check_fractions([bad])
    with pytest.raises(ValueError, match="unknown pruning order"):
        check_order("magnitude")
    with pytest.raises(ValueError, match="unknown attention group"):
        check_groups(["enc_dec"], {"enc_self": (2, 4)})


def test_greedy_masks_nested_with_floor_and_groups():
    shape = {"enc_self": (2, 4), "enc_dec": (2, 4)}
    scores = {"enc_self": torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]), "enc_dec": torch.zeros(2, 4)}
    masks = layout_masks(scores, shape, [0, 0.25, 0.5, 0.75], groups=["enc_self"], min_per_layer=1)
    assert [int((m["enc_self"] == 0).sum()) for m in masks] == [0, 2, 4, 6]
    assert all(bool((m["enc_dec"] == 1).all()) for m in masks)  # other group untouched
    assert all(int(m["enc_self"][layer].sum()) >= 1 for m in masks for layer in range(2))
    assert masks[1]["enc_self"][0].tolist() == [0, 0, 1, 1]  # lowest scores first
    for a, b in zip(masks, masks[1:]):
        assert bool((b <= a).all()) if isinstance(b, torch.Tensor) else bool((b["enc_self"] <= a["enc_self"]).all())
    start = masks[1]
    grown = greedy_mask(ranked_heads(scores, ["enc_self"]), shape, 3, start=start)
    assert bool((grown["enc_self"] <= start["enc_self"]).all()) and int((grown["enc_self"] == 0).sum()) == 3
    assert torch.equal(random_scores(shape, 3)["enc_self"], random_scores(shape, 3)["enc_self"])
