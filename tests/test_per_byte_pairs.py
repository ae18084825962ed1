"""tools/per_byte_pairs.py: the bytes it rebuilds from a committed run's config give each point's recorded bits per byte."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "docs" / "results" / "llm_vocab16k_distill.json"  # the 16,384-token cut: two tokenizers on the same text


def test_rebuilt_bytes_give_every_points_bits_per_byte(monkeypatch):
    per_byte_pairs = pytest.importorskip("per_byte_pairs")
    monkeypatch.chdir(ROOT)  # the committed config reads ../shared/data relative to the project
    run = json.loads(RUN.read_text())
    cfg = OmegaConf.create(run["config"])
    if not Path(cfg.data.dir).is_dir():
        pytest.skip(f"the run's data directory {cfg.data.dir} is not here")
    text_bytes = sum(per_byte_pairs.scored_bytes(cfg, run["results"]["split"]))
    for point in run["results"]["points"]:  # the uncut and the cut tokenizer's points alike
        bits = sum(point["per_example"]["nll"]) / text_bytes / math.log(2)
        assert bits == pytest.approx(point["bits_per_byte"], rel=1e-9)


def test_bits_ratio_of_a_model_with_itself_is_one_and_scales_with_the_nll():
    from per_byte_pairs import bits_ratio

    nll = np.random.default_rng(0).uniform(10.0, 50.0, size=40)
    assert bits_ratio(nll, nll) == pytest.approx((1.0, 1.0, 1.0), rel=1e-12)
    ratio, low, high = bits_ratio(1.25 * nll, nll)
    assert (ratio, low, high) == pytest.approx((1.25, 1.25, 1.25), rel=1e-12)
