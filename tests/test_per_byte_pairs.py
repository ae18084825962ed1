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


def test_points_of_two_runs_on_the_same_texts_pair_by_their_recorded_bits(monkeypatch, capsys):
    """Across two runs on the same 200 texts, a pair's bits-per-byte ratio is the ratio of the two recorded figures."""
    per_byte_pairs = pytest.importorskip("per_byte_pairs")
    monkeypatch.chdir(ROOT)
    wide = RUN.with_name("llm_vocab16k_distill_wide.json")
    runs = [json.loads(path.read_text()) for path in (RUN, wide)]
    if not Path(OmegaConf.create(runs[0]["config"]).data.dir).is_dir():
        pytest.skip("the runs' data directory is not here")
    per_byte_pairs.main([str(RUN), str(wide)])
    lines = capsys.readouterr().out.splitlines()
    points = [len(run["results"]["points"]) for run in runs]
    assert len(lines) == math.comb(sum(points), 2)
    cut = [next(p for p in run["results"]["points"] if p["recovery"] == "finetune" and p["step"] != "0%") for run in runs]
    cross = next(
        line for line in lines if line.startswith(f"{wide.stem}:importance+finetune@") and f"vs {RUN.stem}:importance+finetune@" in line
    )
    assert float(cross.split("bits per byte x")[1].split()[0]) == pytest.approx(cut[1]["bits_per_byte"] / cut[0]["bits_per_byte"], abs=1e-4)
    with pytest.raises(SystemExit, match="given twice"):
        per_byte_pairs.main([str(RUN), str(RUN)])


def test_points_read_through_one_tokenizer_also_pair_per_token(monkeypatch, capsys):
    """Two points on the same tokens get the per-token perplexity ratio of their recorded scores; across tokenizers, none."""
    per_byte_pairs = pytest.importorskip("per_byte_pairs")
    monkeypatch.chdir(ROOT)
    run = json.loads(RUN.read_text())
    if not Path(OmegaConf.create(run["config"]).data.dir).is_dir():
        pytest.skip("the run's data directory is not here")
    per_byte_pairs.main([str(RUN)])
    lines = capsys.readouterr().out.splitlines()
    points = {f"{per_byte_pairs.point_name(p)}@{p['step']}": p for p in run["results"]["points"]}
    for line in lines:
        name_b, name_a = line.split(":")[0].split(" vs ")
        a, b = points[name_a], points[name_b]
        if a["per_example"]["tokens"] == b["per_example"]["tokens"]:
            ratio = float(line.split(", perplexity x")[1].split()[0])
            assert ratio == pytest.approx(b["score"] / a["score"], rel=1e-3)
        else:
            assert ", perplexity x" not in line
    assert any(", perplexity x" in line for line in lines) and any(", perplexity x" not in line for line in lines)
