"""prune.action=stream from the command line: prune, ablate and the study on tiny decoders; results carry the action,
sink and window, every point's pattern is the one its order's scores give, and its KV bytes are the analytic count."""

from __future__ import annotations

import json

import pytest
import torch
from cli_runs import headprune

from headprune.results.run_dir import mask_from_json
from headprune.selection.uniform import layout_masks

SMALL = [
    "data=lm_synthetic",
    "data.synthetic.sizes.eval=24",
    "data.synthetic.sizes.importance=16",
    "data.synthetic.sizes.heldout=16",
    "data.tokenizer.vocab_size=200",
    "logger=none",
]
SINK, WINDOW, CONTEXT = 4, 16, 48  # conf/prune/default.yaml's prune.stream; lm_synthetic's max_length
HEAD_DIM, LAYERS, KV_HEADS = {"tiny_llama": 8, "tiny_gemma": 16}, 2, 2


def _run(capsys, monkeypatch, tmp_path, name: str, *overrides: str) -> dict:
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / name, *SMALL, *overrides)
    assert status == 0, err
    return json.loads((tmp_path / name / "results.json").read_text())["results"]


def _kv_bytes(mask: list[list[int]], model: str, per_kv: int) -> int:
    """The KV cache of one sequence at the context, counted here: full KV groups hold every token, streamed ones sink + window
    (tiny_gemma's first layer slides over 8 tokens: every group holds 7); float32 keys and values of ``HEAD_DIM``."""
    total = 0
    for layer, row in enumerate(mask):
        groups = [row[k * per_kv : (k + 1) * per_kv] for k in range(KV_HEADS)]  # the query heads (or the one KV group) of each
        if model == "tiny_gemma" and layer == 0:
            keys = KV_HEADS * 7
        else:
            keys = sum(SINK + WINDOW if set(g) == {0} else CONTEXT for g in groups)
        total += 2 * keys * HEAD_DIM[model] * 4
    return total


def _check_points(result: dict, model: str, per_kv: int) -> None:
    """Every order's patterns are its scores' masks at the fractions asked, labelled by what they stream, with their KV bytes."""
    assert result["action"] == "stream" and result["stream"]["sink"] == SINK and result["stream"]["window"] == WINDOW
    assert result["stream"]["context_tokens"] == CONTEXT
    assert result["stream"]["kv_bytes_full"] == _kv_bytes([[1] * 4] * LAYERS, model, per_kv)
    shape = {"dec_self": (LAYERS, KV_HEADS if result["unit"] == "kv_group" else 4)}
    noun = "KV groups" if result["unit"] == "kv_group" else "heads"
    for order, curve in result["orders"].items():
        scores = {g: torch.tensor(v) for g, v in curve["head_scores"].items()}
        expected = layout_masks(scores, shape, [s["fraction"] for s in curve["steps"]])
        for step, mask in zip(curve["steps"], expected):
            assert torch.equal(mask_from_json(step["mask"])["dec_self"], mask["dec_self"]), (order, step["fraction"])
            assert step["streamed"].startswith(f"{noun} streamed ")
            assert step["kv_bytes"] == _kv_bytes(step["mask"]["dec_self"], model, per_kv), (order, step["fraction"])
            assert step["kv_fraction"] == pytest.approx(step["kv_bytes"] / result["stream"]["kv_bytes_full"])


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_gemma"])
def test_prune_streams_kv_groups_by_every_order(tmp_path, capsys, monkeypatch, model):
    result = _run(
        capsys,
        monkeypatch,
        tmp_path,
        "prune",
        "experiment=prune",
        f"model={model}",
        "prune.action=stream",
        "prune.unit=kv_group",
        "prune.order=[importance,fisher,ablation,random,duo]",
        "prune.fractions=[0,0.25,0.5,0.75]",
        "prune.n_samples=100",
        "prune.duo.steps=5",
    )
    assert result["unit"] == "kv_group"
    _check_points(result, model, per_kv=1)


def test_prune_streams_query_heads_counting_whole_kv_groups(tmp_path, capsys, monkeypatch):
    """The plain command (prune.unit=head): heads streamed one by one, the cache shrinking only for whole KV groups."""
    result = _run(
        capsys, monkeypatch, tmp_path, "prune", "experiment=prune", "model=tiny_llama", "prune.action=stream", "prune.fractions=[0,0.5]"
    )
    assert result["unit"] == "head"
    _check_points(result, "tiny_llama", per_kv=2)


def test_ablate_streams_one_kv_group_at_a_time_with_significance(tmp_path, capsys, monkeypatch):
    """On tiny_gemma a streamed group of the sliding layer (window 8, inside sink + window) changes nothing; the others may."""
    result = _run(
        capsys,
        monkeypatch,
        tmp_path,
        "ablate",
        "experiment=ablate",
        "model=tiny_gemma",
        "prune.action=stream",
        "prune.unit=kv_group",
        "ablate.n_samples=200",
    )["splits"]["eval"]
    assert result["action"] == "stream" and result["stream"] == {
        "sink": SINK,
        "window": WINDOW,
        "context_tokens": CONTEXT,
        "kv_bytes_full": _kv_bytes([[1] * 4] * LAYERS, "tiny_gemma", 1),
    }
    delta = torch.tensor(result["delta"]["dec_self"])
    assert delta.shape == (LAYERS, KV_HEADS)
    assert delta[0].abs().max() <= 1e-5 * result["base_score"]  # the sliding layer sees its last 8 tokens either way
    assert len(result["rows"]) == LAYERS * KV_HEADS and all(0 <= r["p_value"] <= 1 for r in result["rows"])


def test_study_streams_and_skips_the_speed_stage(tmp_path, capsys, monkeypatch):
    status, err = headprune(
        capsys,
        monkeypatch,
        tmp_path,
        tmp_path / "study",
        *SMALL,
        "experiment=study",
        "model=tiny_llama",
        "study.train=false",
        "study.n_samples=100",
        "prune.action=stream",
        "prune.unit=kv_group",
        "prune.fractions=[0,0.5]",
    )
    assert status == 0, err
    results = json.loads((tmp_path / "study" / "results.json").read_text())["results"]
    assert results["action"] == "stream" and results["stream"]["window"] == WINDOW
    assert {"ablate", "keep_one", "prune"} <= set(results) and "speed" not in results
    assert set(results["prune"]["orders"]) == {"importance", "ablation", "random"}  # entropy left out: it cannot rank streaming
    _check_points(results["prune"], "tiny_llama", per_kv=1)
    assert results["keep_one"]["action"] == "stream" and len(results["keep_one"]["rows"]) == LAYERS


PASSKEY = [
    "data=passkey_synthetic",
    "data.sizes.eval=8",
    "data.sizes.importance=6",
    "data.sizes.heldout=4",
    "data.sizes.train=4",
    "logger=none",
]
PASSKEY_CONTEXT = 96  # passkey_synthetic's data.context_lengths


@pytest.mark.parametrize("model", ["tiny_llama", "tiny_gemma"])
def test_prune_streams_on_passkey_by_retrieval_and_duo(tmp_path, capsys, monkeypatch, model):
    """The long-context task: streaming points ranked by the retrieval score and DuoAttention's gates, with a real score,
    their patterns what the orders' scores give and their KV bytes counted at the passkey context."""
    status, err = headprune(
        capsys,
        monkeypatch,
        tmp_path,
        tmp_path / "prune",
        *PASSKEY,
        "experiment=prune",
        f"model={model}",
        "prune.action=stream",
        "prune.unit=kv_group",
        "prune.order=[importance,retrieval,duo]",
        "prune.fractions=[0,0.5,0.75]",
        "prune.duo.steps=5",
    )
    assert status == 0, err
    payload = json.loads((tmp_path / "prune" / "results.json").read_text())
    result = payload["results"]
    assert payload["inputs"]["task"] == "passkey" and result["action"] == "stream"
    assert result["stream"]["context_tokens"] == PASSKEY_CONTEXT
    shape = {"dec_self": (LAYERS, KV_HEADS)}
    for order, curve in result["orders"].items():
        scores = {g: torch.tensor(v) for g, v in curve["head_scores"].items()}
        expected = layout_masks(scores, shape, [s["fraction"] for s in curve["steps"]])
        for step, mask in zip(curve["steps"], expected):
            assert torch.equal(mask_from_json(step["mask"])["dec_self"], mask["dec_self"]), (order, step["fraction"])
    retrieval = torch.tensor(result["orders"]["retrieval"]["head_scores"]["dec_self"])
    assert ((retrieval >= 0) & (retrieval <= 1)).all()  # a share of the copied tokens
    full = result["stream"]["kv_bytes_full"]
    assert full == 2 * LAYERS * KV_HEADS * PASSKEY_CONTEXT * HEAD_DIM[model] * 4 or model == "tiny_gemma"  # gemma: one sliding layer


def test_ablate_streams_on_passkey(tmp_path, capsys, monkeypatch):
    status, err = headprune(
        capsys,
        monkeypatch,
        tmp_path,
        tmp_path / "ablate",
        *PASSKEY,
        "experiment=ablate",
        "model=tiny_llama",
        "prune.action=stream",
        "prune.unit=kv_group",
        "ablate.n_samples=100",
    )
    assert status == 0, err
    result = json.loads((tmp_path / "ablate" / "results.json").read_text())["results"]["splits"]["eval"]
    assert result["action"] == "stream" and len(result["rows"]) == LAYERS * KV_HEADS
    assert result["metric"] == "key_log_likelihood"


def test_the_unstreamed_task_scores_as_its_all_full_mask(tmp_path):
    """StreamTask.evaluate(None) skips the streamed branch; a mask of ones computes it with weight 0: the same score."""
    from experiment_helpers import make_cfg

    from headprune.tasks import registry

    torch.set_num_threads(1)
    cfg = make_cfg(tmp_path, "prune", "lm", "prune.action=stream", "prune.unit=kv_group")
    task = registry.load_task(cfg)
    plain, ones = task.evaluate(None), task.evaluate(task.gates.ones())
    assert plain.score == pytest.approx(ones.score, rel=1e-6)
    streamed = task.evaluate({"dec_self": torch.zeros(LAYERS, KV_HEADS)})
    assert streamed.score != pytest.approx(plain.score, rel=1e-6)  # streaming every group moves the perplexity
