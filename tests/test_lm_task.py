"""LanguageModelingTask on a tiny random Llama and the synthetic language: perplexity, batched masks, paired test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from experiment_helpers import compose_cfg
from omegaconf import open_dict

from headprune.core.masks import kv_to_head_mask
from headprune.scoring.importance import per_example_loss as importance_loss
from headprune.scoring.significance import paired_bootstrap_perplexity

LM = [
    "experiment=inspect",
    "model=tiny_llama",
    "data=lm_synthetic",
    "data.synthetic.sizes.eval=24",
    "data.synthetic.sizes.importance=40",
    "data.synthetic.sizes.heldout=8",
    "data.eval_batch_size=7",
    "logger=none",
]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from headprune.tasks.lm.task import load_lm_task

    torch.set_num_threads(1)
    return load_lm_task(compose_cfg(tmp_path_factory.mktemp("lm"), LM))


def _manual_nll(model, ids: list[int]) -> tuple[float, int]:
    """NLL sum and predicted tokens of one text, alone (no padding), from log-softmax by hand."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].double()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    return float(-logp.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).sum()), len(ids) - 1


def test_evaluate_equals_text_by_text_computation(task):
    result = task.evaluate()
    ids = task.data.split("eval")
    manual = [_manual_nll(task.model, x) for x in ids]
    np.testing.assert_allclose(result.per_example["nll"], [m[0] for m in manual], atol=1e-4, rtol=1e-6)
    assert result.per_example["tokens"] == [m[1] for m in manual]
    total_nll, total_tokens = sum(m[0] for m in manual), sum(m[1] for m in manual)
    assert result.score == pytest.approx(np.exp(total_nll / total_tokens), rel=1e-6)
    assert result.loss == pytest.approx(np.mean([n / t for n, t in manual]), rel=1e-6)
    assert result.metric == "perplexity" and result.n == len(ids) == task.split_sizes()["eval"]
    assert task.higher_is_better is False


def test_evaluate_many_equals_evaluate_per_mask(task):
    gen = torch.Generator().manual_seed(0)
    layers, heads = task.gates.groups["dec_self"]
    masks = [
        None,
        {"dec_self": (torch.rand(layers, heads, generator=gen) > 0.4).float()},
        kv_to_head_mask({"dec_self": torch.tensor([[1.0, 0.0], [0.0, 0.0]])}, task.gates.heads_per_kv),
        {"dec_self": torch.zeros(layers, heads)},
    ]
    task.mask_chunk = 3  # two chunks: 3 masks + 1
    together = task.evaluate_many(masks)
    for mask, result in zip(masks, together):
        alone = task.evaluate(mask)
        np.testing.assert_allclose(result.per_example["nll"], alone.per_example["nll"], atol=1e-4, rtol=1e-6)
        assert result.score == pytest.approx(alone.score, rel=1e-6)
    assert together[-1].score != pytest.approx(together[0].score)


def test_paired_test_sanity(task):
    base = task.evaluate()
    empty = task.evaluate({"dec_self": torch.zeros(*task.gates.groups["dec_self"])})
    same, worse = task.paired_test(base, [base, empty], n_samples=200, seed=0, alpha=0.05)
    assert same.delta == 0 and same.p_value == 1.0 and not same.significant
    assert worse.delta == pytest.approx(empty.score - base.score)
    assert worse.ci_low <= worse.delta <= worse.ci_high


def test_perplexity_bootstrap_equals_explicit_resampling():
    rng = np.random.default_rng(1)
    tokens = rng.integers(3, 20, size=30)
    base = tokens * rng.uniform(2.0, 3.0, size=30)
    system = base * rng.uniform(0.9, 1.4, size=30)
    (result,) = paired_bootstrap_perplexity(base, tokens, [system], tokens, n_samples=300, seed=7, alpha=0.05)
    idx = np.random.default_rng(7).integers(0, 30, size=(300, 30))  # the same draws, one resample at a time
    diffs = np.array([np.exp(system[i].sum() / tokens[i].sum()) - np.exp(base[i].sum() / tokens[i].sum()) for i in idx])
    delta = np.exp(system.sum() / tokens.sum()) - np.exp(base.sum() / tokens.sum())
    assert result.delta == pytest.approx(delta)
    np.testing.assert_allclose([result.ci_low, result.ci_high], np.percentile(diffs, [2.5, 97.5]), rtol=1e-9)
    centred = np.abs(diffs) - np.abs(diffs).mean()
    assert result.p_value == pytest.approx((np.sum(centred > abs(delta)) + 1) / 301)


def test_importance_batches_are_training_texts_with_next_token_labels(task):
    batches = list(task.importance_batches())
    assert sum(len(b["input_ids"]) for b in batches) == task.split_sizes()["importance"]
    assert task.data_fingerprint("importance") != task.data_fingerprint("eval")
    batch = batches[0]
    valid = batch["labels"] != -100
    assert torch.equal(batch["labels"][:, :-1][valid[:, :-1]], batch["input_ids"][:, 1:][valid[:, :-1]])
    with torch.no_grad():  # the core's default loss on these batches is the task's per-text loss
        outputs = task.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        torch.testing.assert_close(importance_loss(outputs, batch), task.per_example_loss(batch), atol=1e-6, rtol=1e-6)


def test_training_batches_draw_training_texts(task):
    drawn = task.training_batches(5, seed=1)
    texts = {tuple(row[row != task.data.pad_id].tolist()) for b in drawn for row in b["input_ids"]}
    training = {tuple(ids) for ids in task.data.split("train")}
    assert len(texts) == 5 and texts <= training
    assert task.per_example_loss(drawn[0]).shape == (len(drawn[0]["input_ids"]),)


def test_timing_batches_and_prefill(task):
    batches = task.timing_batches(batch_size=4, examples=10, seed=3)
    assert [len(b["input_ids"]) for b in batches] == [4, 4, 2] and set(batches[0]) == {"input_ids", "attention_mask"}
    assert torch.equal(task.timing_batches(4, 10, seed=3)[0]["input_ids"], batches[0]["input_ids"])
    task.timed_call(batches[0])


def test_saved_pruned_task_model_reloads_with_the_same_perplexity(task, tmp_path):
    import copy

    from headprune.core.pruning import prune_mask
    from headprune.tasks.lm.task import LanguageModelingTask, load_lm_task

    mask = {"dec_self": torch.tensor([[1.0, 0.0, 1.0, 1.0], [0.0, 1.0, 0.0, 0.0]])}
    masked = task.evaluate(mask)
    pruned = LanguageModelingTask(copy.deepcopy(task.model), task.tokenizer, task.data)
    prune_mask(pruned.model, mask)
    assert pruned.evaluate().score == pytest.approx(masked.score, rel=1e-5)
    pruned.save_hf(tmp_path / "model")
    cfg = compose_cfg(tmp_path, LM + [f"model.pretrained={tmp_path / 'model'}", f"model.tokenizer={tmp_path / 'model'}"])
    reloaded = load_lm_task(cfg)
    assert reloaded.evaluate().score == pytest.approx(masked.score, rel=1e-5)


def test_local_text_files(tmp_path):
    from headprune.tasks.lm.data import load_texts

    data = tmp_path / "data"
    (data / "news").mkdir(parents=True)
    (data / "news" / "a.en").write_text("first news line\n\nsecond news line\n")
    (data / "news" / "b.en").write_text("third news line\n")
    (data / "train.en").write_text("".join(f"training sentence {i}\n" for i in range(10)))
    cfg = compose_cfg(
        tmp_path,
        [
            "model=tiny_llama",
            "data=lm_local",
            "data.files.eval=[news/a.en,news/b.en]",
            "data.files.importance=[train.en]",
            "data.files.heldout=[train.en]",
            "data.limits.importance=4",
            "data.files.eval_other=null",
            "data.files.train=null",
        ],
    )
    with open_dict(cfg):
        cfg.data.dir = str(data)
    texts = load_texts(cfg.data)
    assert texts["eval"] == ["first news line", "second news line", "third news line"]
    assert len(texts["importance"]) == 4 and texts["importance"] == sorted(texts["importance"], key=lambda t: int(t.split()[-1]))
    with open_dict(cfg):
        cfg.data.files.heldout = ["news/b.en"]
    with pytest.raises(ValueError, match="for evaluation and for importance/held-out choices"):
        load_texts(cfg.data)
    with open_dict(cfg):
        cfg.data.files.heldout = ["missing.en"]
    with pytest.raises(FileNotFoundError, match="missing.en not found"):
        load_texts(cfg.data)


def test_text_start_token_from_the_model_config(tmp_path):
    from headprune.tasks.lm.task import load_lm_task

    task = load_lm_task(compose_cfg(tmp_path, LM + ["+model.text_start='</s>'"]))
    assert {ids[0] for ids in task.data.split("eval")} == {task.tokenizer.eos_token_id}
    with pytest.raises(ValueError, match="model.text_start='<nope>' is not a token of the tiny_llama tokenizer"):
        load_lm_task(compose_cfg(tmp_path, LM + ["+model.text_start='<nope>'"]))


def test_hub_texts_drop_empty_lines(tmp_path, monkeypatch):
    import datasets

    from headprune.tasks.lm.data import load_texts

    calls = []

    def fake_load_dataset(path, name, split):
        calls.append((path, name, split))
        return {"text": ["", " = Heading = \n", "A sentence of the corpus .\n", "  "]}

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    cfg = compose_cfg(tmp_path, ["model=tiny_llama", "data=lm_hub"])
    texts = load_texts(cfg.data)
    assert texts["eval"] == ["= Heading =", "A sentence of the corpus ."]
    assert ("Salesforce/wikitext", "wikitext-103-raw-v1", "test") in calls and len(calls) == 3


def test_bits_per_byte_equals_the_nll_over_the_texts_bytes(task):
    from headprune.export.client_check import adds_prefix_space

    result = task.evaluate()
    texts, ids = task.data.texts["eval"], task.data.split("eval")
    assert [len(x) for x in ids] == [1 + len(task.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]  # BOS, whole texts
    spaced = adds_prefix_space(task.tokenizer)  # the scored tokens cover the space the tokenizer puts before the text
    covered = sum(len(text.encode("utf-8")) + int(spaced and not text.startswith(" ")) for text in texts)
    nll = sum(_manual_nll(task.model, x)[0] for x in ids)
    assert result.measures["bits_per_byte"] == pytest.approx(nll / (np.log(2) * covered), rel=1e-6)
    assert result.measures["perplexity_per_byte"] == pytest.approx(2 ** result.measures["bits_per_byte"], rel=1e-9)


def test_json_lines_texts_are_the_distinct_fields_of_each_row(tmp_path):
    """A gzip JSON-lines file gives each row's fields as texts, in file order, a repeated text once (as a set of rows would)."""
    import gzip
    import json

    from headprune.tasks.data_sources import json_texts

    rows = [{"premise": f"premise {i % 3}", "hypothesis": f"hypothesis {i}", "label": "neutral"} for i in range(7)]
    path = tmp_path / "train.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        handle.write("".join(json.dumps(row) + "\n" for row in rows) + "\n")  # a blank last line is no row
    expected = list(dict.fromkeys(row[field] for row in rows for field in ("premise", "hypothesis")))
    assert json_texts(path, ["premise", "hypothesis"]) == expected
    assert json_texts(path, ["premise"]) == ["premise 0", "premise 1", "premise 2"]


def test_lm_wide_trains_on_the_json_rows_and_evaluates_lm_local_texts(tmp_path):
    """data=lm_wide draws lm_local's eval texts and adds a JSON-lines file's premises to training, splits disjoint."""
    import gzip
    import json

    from headprune.tasks.lm.data import load_texts

    root = tmp_path / "data"
    for name in ["wmt/en-de/newstest2012.en", "wmt/en-de/newstest2013.en", "iwslt14_de-en/valid.en", "iwslt14_de-en/test.en"] + [
        f"wmt/en-de/newstest{year}.en" for year in (2014, 2015, 2016, 2017)
    ]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("".join(f"{name} line {i}\n" for i in range(6)))
    (root / "mnli").mkdir()
    with gzip.open(root / "mnli" / "train.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.write("".join(json.dumps({"premise": f"premise {i}", "hypothesis": "h"}) + "\n" for i in range(5)))
    limits = ["data.limits.eval=3", "data.limits.eval_other=2", "data.limits.importance=4", "data.limits.heldout=2"]
    cfg = compose_cfg(tmp_path, ["experiment=inspect", "model=tiny_llama", "data=lm_wide", f"data.dir={root}", *limits, "logger=none"])
    texts = load_texts(cfg.data)
    assert [t for t in texts["train"] if t.startswith("premise")] == [f"premise {i}" for i in range(5)]
    assert len(texts["train"]) == 5 + 3 * 6 - 4 - 2  # the news and talks lines importance and held-out left, and the premises
    splits = list(texts.values())
    assert all(not set(a) & set(b) for i, a in enumerate(splits) for b in splits[i + 1 :])
