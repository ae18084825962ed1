"""The passkey task on a tiny random Llama: examples from a seed, needles where asked, exact match equal to greedy
decoding, batched masks equal to one at a time, per-example scores for the paired bootstrap; long documents (lm_long)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from experiment_helpers import compose_cfg

from headprune.scoring.importance import per_example_loss as importance_loss

PASSKEY = [
    "experiment=inspect",
    "model=tiny_llama",
    "data=passkey_synthetic",
    "data.sizes.eval=12",
    "data.sizes.importance=6",
    "data.sizes.heldout=4",
    "data.sizes.train=6",
    "data.eval_batch_size=5",
    "logger=none",
]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from headprune.tasks.longctx.task import load_passkey_task

    torch.set_num_threads(1)
    return load_passkey_task(compose_cfg(tmp_path_factory.mktemp("passkey"), PASSKEY))


def _generate(task, *overrides, tmp_path):
    """The examples of the test config with ``overrides``, in the task's tokenizer (no model built)."""
    from headprune.tasks.longctx.config import PasskeyConfig
    from headprune.tasks.longctx.examples import generate
    from headprune.tasks.longctx.haystack import haystack_pools

    config = PasskeyConfig.from_cfg(compose_cfg(tmp_path, PASSKEY + list(overrides)).data)
    pools = haystack_pools(config)
    return generate(config, task.tokenizer, task.tokenizer.bos_token_id, pools), pools, config


def _filler_offset(example, needle: int) -> int:
    """Filler tokens before needle ``needle`` (the other needles' tokens left out)."""
    start = example.needles[needle][0]
    before = sum(end - begin for begin, end in example.needles[:needle])
    return start - example.haystack[0] - before


def test_examples_are_deterministic_from_the_seed(task, tmp_path):
    first, _, _ = _generate(task, tmp_path=tmp_path)
    again, _, _ = _generate(task, tmp_path=tmp_path)
    other, _, _ = _generate(task, "data.seed=1", tmp_path=tmp_path)
    assert first == again
    assert [e.ids for e in first["eval"]] != [e.ids for e in other["eval"]]
    assert [e.ids for e in first["eval"]] == [e.ids for e in task.data.split("eval")]  # the task's own examples


def test_context_length_is_exact_and_the_needle_sits_at_its_depth(task, tmp_path):
    examples, pools, config = _generate(task, "data.context_lengths=[80,112]", "data.depths=[0.0,0.3,0.7,1.0]", tmp_path=tmp_path)
    longest_sentence = max(len(task.tokenizer(" " + s, add_special_tokens=False)["input_ids"]) for s in pools["eval"])
    cells = set()
    for e in examples["eval"]:
        cells.add((e.length, e.depth))
        assert e.answer_start == e.length  # the prompt holds exactly the tokens asked for
        filler = e.haystack[1] - e.haystack[0] - sum(end - start for start, end in e.needles)
        offset = _filler_offset(e, e.asked)
        if e.depth in (0.0, 1.0):
            assert offset == e.depth * filler  # first or last in the haystack
        assert abs(offset - e.depth * filler) <= longest_sentence  # the sentence start nearest to the depth
    assert cells == {(length, depth) for length in (80, 112) for depth in (0.0, 0.3, 0.7, 1.0)}  # every cell of the grid


def test_the_answer_repeats_the_needles_key_tokens(task):
    for e in task.data.split("eval"):
        key = task.tokenizer(" " + e.keys[e.asked], add_special_tokens=False)["input_ids"]
        assert list(e.answer) == key and e.copies == (0,) * len(key)
        start, end = e.needles[0]
        needle = list(e.ids[start:end])
        assert any(needle[i : i + len(key)] == key for i in range(len(needle)))  # the key's very tokens in the needle
        assert e.keys[0] in task.tokenizer.decode(needle)


def test_several_needles_ask_for_one_or_all(task, tmp_path):
    overrides = ["data.needles=3", "data.context_lengths=[200]", "data.depths=[0.5]"]
    one, _, _ = _generate(task, *overrides, tmp_path=tmp_path)
    for e in one["eval"]:
        assert len(e.needles) == 3 and len(set(e.keys)) == 3 and 0 <= e.asked < 3
        assert [s for s, _ in e.needles] == sorted(s for s, _ in e.needles)
        assert task.tokenizer.decode(list(e.answer)).strip() == e.keys[e.asked]
        assert set(e.copies) == {e.asked}
    every, _, _ = _generate(task, *overrides, "data.ask=all", tmp_path=tmp_path)
    for e in every["eval"]:
        assert e.asked == -1 and task.tokenizer.decode(list(e.answer)).replace(" ", "") == ",".join(e.keys)
        assert [c for c in dict.fromkeys(e.copies) if c >= 0] == [0, 1, 2]  # keys in the order the needles appear


def test_splits_share_no_example_and_no_key(task):
    keys = {split: {k for e in examples for k in e.keys} for split, examples in task.data.rows.items()}
    splits = list(keys)
    for i, a in enumerate(splits):
        for b in splits[i + 1 :]:
            assert not keys[a] & keys[b], (a, b)
            assert not set(task.data.fingerprint_texts(a)) & set(task.data.fingerprint_texts(b))
    assert task.data_fingerprint("eval") != task.data_fingerprint("heldout")


def _with_answer(example, answer: list[int]):
    """The example with its answer replaced (same prompt)."""
    ids = example.ids[: example.answer_start] + tuple(answer)
    return dataclasses.replace(example, ids=ids, copies=(0,) * len(answer))


def test_exact_match_equals_greedy_decoding(task):
    """Answers set to the model's own greedy continuation must score correct, and any other answer not."""
    from headprune.tasks.longctx.data import PasskeyData

    originals = task.data.split("eval")[:6]
    variants = []
    for i, e in enumerate(originals):
        prompt = torch.tensor([e.ids[: e.answer_start]])
        with torch.no_grad():
            greedy = task.model.generate(
                input_ids=prompt,
                attention_mask=torch.ones_like(prompt),
                max_new_tokens=len(e.answer),
                min_new_tokens=len(e.answer),
                do_sample=False,
                pad_token_id=task.data.pad_id,
            )[0, prompt.shape[1] :].tolist()
        wrong = list(greedy)
        wrong[i % len(wrong)] = (wrong[i % len(wrong)] + 1) % len(task.tokenizer)  # one token off, at another place each time
        variants += [_with_answer(e, greedy), _with_answer(e, wrong), e]
    saved = task.data
    task.data = PasskeyData({"eval": variants}, saved.pad_id, saved.batch_size, 4)
    try:
        result = task.evaluate()
    finally:
        task.data = saved
    correct = result.per_example["correct"]
    assert correct[0::3] == [1] * len(originals) and correct[1::3] == [0] * len(originals)
    assert correct[2::3] == [int(list(e.answer) == list(v.answer)) for e, v in zip(originals, variants[0::3])]


def test_scores_are_per_example_and_bootstrap_ready(task):
    result = task.evaluate()
    n = task.split_sizes()["eval"]
    assert result.n == n and len(result.per_example["correct"]) == n and len(result.per_example["loglik"]) == n
    assert result.metric == "key_log_likelihood" and task.higher_is_better
    assert result.score == pytest.approx(np.mean(result.per_example["loglik"]), rel=1e-9)
    assert result.loss == pytest.approx(-result.score, rel=1e-9)
    assert len(set(np.round(result.per_example["loglik"], 6))) > 1  # a random model's score moves between examples
    empty = task.evaluate({"dec_self": torch.zeros(*task.gates.groups["dec_self"])})
    same, other = task.paired_test(result, [result, empty], n_samples=200, seed=0, alpha=0.05)
    assert same.delta == 0 and same.p_value == 1.0 and not same.significant
    assert other.delta == pytest.approx(empty.score - result.score) and other.ci_low <= other.delta <= other.ci_high
    task.metric = "accuracy"
    try:
        accuracy = task.evaluate()
        (vs_self,) = task.paired_test(accuracy, [accuracy], n_samples=50)
    finally:
        task.metric = "key_log_likelihood"
    assert accuracy.score == pytest.approx(100 * np.mean(accuracy.per_example["correct"])) and vs_self.delta == 0


def test_loglik_is_the_mean_log_probability_of_the_answer(task):
    result = task.evaluate()
    for e, loglik in zip(task.data.split("eval")[:4], result.per_example["loglik"]):
        with torch.no_grad():
            logits = task.model(input_ids=torch.tensor([e.ids[:-1]])).logits[0].double()
        logp = torch.log_softmax(logits[e.answer_start - 1 :], -1).gather(1, torch.tensor(e.answer).unsqueeze(1))
        assert loglik == pytest.approx(float(logp.mean()), abs=1e-5)


def test_evaluate_many_equals_evaluate_per_mask(task):
    gen = torch.Generator().manual_seed(0)
    layers, heads = task.gates.groups["dec_self"]
    masks = [None, {"dec_self": (torch.rand(layers, heads, generator=gen) > 0.4).float()}, {"dec_self": torch.zeros(layers, heads)}]
    together = task.evaluate_many(masks)  # the batched engine
    for mask, result in zip(masks, together):
        alone = task.evaluate(mask)
        np.testing.assert_allclose(result.per_example["loglik"], alone.per_example["loglik"], atol=1e-5, rtol=1e-6)
        assert result.per_example["correct"] == alone.per_example["correct"]
    assert together[-1].score != pytest.approx(together[0].score)


def test_importance_batches_label_only_the_answer(task):
    from headprune.scoring.importance import importance_scores

    batches = list(task.importance_batches())
    assert sum(len(b["input_ids"]) for b in batches) == task.split_sizes()["importance"]
    batch = batches[0]
    assert int((batch["labels"] != -100).sum()) == sum(len(task.data.split("importance")[i].answer) for i in range(len(batch["labels"])))
    with torch.no_grad():  # the core's default loss is the task's: minus each example's loglik
        outputs = task.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        torch.testing.assert_close(importance_loss(outputs, batch), task.per_example_loss(batch), atol=1e-5, rtol=1e-5)
    scores = importance_scores(task.model, task.gates, batches, normalize_layers=False)["dec_self"]
    assert scores.shape == (layers_heads := task.gates.groups["dec_self"]) and bool((scores > 0).all()), layers_heads


def test_training_and_timing_batches(task):
    drawn = task.training_batches(4, seed=1)
    assert sum(len(b["input_ids"]) for b in drawn) == 4 and task.per_example_loss(drawn[0]).shape == (len(drawn[0]["input_ids"]),)
    timing = task.timing_batches(batch_size=3, examples=5, seed=2)
    assert [len(b["input_ids"]) for b in timing] == [3, 2] and set(timing[0]) == {"input_ids", "attention_mask"}
    assert timing[0]["input_ids"].shape[1] == task.data.split("eval")[0].answer_start  # the prompts, without their answers
    task.timed_call(timing[0])


def test_local_haystack_reads_each_splits_own_files(tmp_path):
    from headprune.tasks.longctx.config import PasskeyConfig
    from headprune.tasks.longctx.haystack import HaystackError, haystack_pools

    data = tmp_path / "data"
    data.mkdir()
    for split in ("eval", "importance", "heldout"):
        (data / f"{split}.txt").write_text("".join(f"{split} sentence number {i}.\n" for i in range(30)) + "\n")
    overrides = [
        "data=passkey_local",
        f"data.dir={data}",
        "data.files.eval=[eval.txt]",
        "data.files.importance=[importance.txt]",
        "data.files.heldout=[heldout.txt]",
        "data.files.train=null",
        "data.sizes.train=0",
    ]
    config = PasskeyConfig.from_cfg(compose_cfg(tmp_path, PASSKEY + overrides).data)
    pools = haystack_pools(config)
    assert set(pools) == {"eval", "importance", "heldout"} and pools["heldout"][3] == "heldout sentence number 3."
    shared = PasskeyConfig.from_cfg(compose_cfg(tmp_path, PASSKEY + overrides + ["data.files.heldout=[eval.txt]"]).data)
    with pytest.raises(HaystackError, match="for eval and for another split"):
        haystack_pools(shared)
    (data / "empty.txt").write_text("\n  \n")
    empty = PasskeyConfig.from_cfg(compose_cfg(tmp_path, PASSKEY + overrides + ["data.files.heldout=[empty.txt]"]).data)
    with pytest.raises(HaystackError, match="the heldout haystack holds no text"):
        haystack_pools(empty)


def test_repeat_haystack_cycles_its_sentences(task, tmp_path):
    """data.source=repeat: every haystack is the given sentences in order, from any one of them, in every split."""
    sentences = ["Apple pie is sweet.", "Rivers run to the sea.", "Stones sit still."]
    overrides = ["data.source=repeat", "data.repeat=[" + ",".join(sentences) + "]", "data.sizes.train=0"]
    examples, pools, config = _generate(task, *overrides, tmp_path=tmp_path)
    assert set(pools) == set(config.splits) and all(pool == sentences for pool in pools.values())
    cycle = "".join(sentences).replace(" ", "") * 8
    for split in config.splits:
        for e in examples[split]:
            spans = [(e.haystack[0], e.needles[0][0]), (e.needles[0][1], e.haystack[1])]  # the filler around the needle
            text = "".join(task.tokenizer.decode(list(e.ids[a:b])) for a, b in spans).replace(" ", "")
            assert text and text in cycle, text


def test_hub_haystack_reads_the_text_field(tmp_path, monkeypatch):
    import datasets

    from headprune.tasks.longctx.config import PasskeyConfig
    from headprune.tasks.longctx.haystack import haystack_pools

    calls = []

    def fake_load_dataset(path, name, split):
        calls.append((path, name, split))
        return {"text": ["", " = Heading = \n", f"A sentence of {split} .\n", "  "]}

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    config = PasskeyConfig.from_cfg(compose_cfg(tmp_path, PASSKEY + ["data=passkey_hub"]).data)
    pools = haystack_pools(config)
    assert pools["eval"] == ["= Heading =", "A sentence of test ."] and ("Salesforce/wikitext", "wikitext-2-raw-v1", "test") in calls


def test_long_documents_join_consecutive_lines(tmp_path):
    from headprune.tasks.lm.task import load_lm_task

    data = tmp_path / "data"
    data.mkdir()
    for name in ("a", "b", "c"):
        (data / f"{name}.en").write_text("".join(f"line {i} of file {name} with some words\n" for i in range(40)))
    overrides = [
        "experiment=inspect",
        "model=tiny_llama",
        "data=lm_long",
        f"data.dir={data}",
        "data.files.eval=[a.en]",
        "data.files.eval_other=null",
        "data.files.importance=[b.en]",
        "data.files.heldout=[c.en]",
        "data.files.train=[c.en]",
        "data.document_tokens=60",
        "data.max_length=64",
        "data.limits={eval: null, importance: 3, heldout: 2, train: null}",
        "data.tokenizer.vocab_size=200",
        "logger=none",
    ]
    task = load_lm_task(compose_cfg(tmp_path, overrides))
    for split in ("eval", "heldout", "train"):
        for text in task.data.texts[split]:
            lines = text.split("\n")
            numbers = [int(line.split()[1]) for line in lines]
            assert numbers == list(range(numbers[0], numbers[0] + len(lines))) and len(lines) > 1  # consecutive lines
            assert len(task.tokenizer(text, add_special_tokens=False)["input_ids"]) >= 60
    assert all(len(ids) == 64 for ids in task.data.split("eval"))  # BOS + the document, cut to max_length
    assert len(task.data.split("importance")) == 3 and len(task.data.split("heldout")) == 2
    assert not set(task.data.texts["heldout"]) & set(task.data.texts["train"])  # the same file, other documents


@pytest.mark.slow  # loads the embedded SmolLM2 and runs it on prompts of 580 tokens (about a minute on one CPU thread)
def test_smollm2_retrieves_the_passkey_and_has_retrieval_heads(tmp_path):
    """The embedded SmolLM2-135M finds a 5-digit key in a 540-token haystack (the classic prompt of data=passkey_local),
    its exact match is greedy decoding's, and a few of its heads copy the key (Wu et al. 2024 find under 5%)."""
    pytest.importorskip("gguf")
    from headprune.models import embedded
    from headprune.scoring.retrieval_heads import retrieval_scores
    from headprune.tasks.longctx.task import load_passkey_task

    try:
        embedded.embedded_model_dir("smollm2")
    except ModuleNotFoundError as err:
        pytest.skip(str(err))
    classic = compose_cfg(tmp_path, ["model=smollm2", "data=passkey_local"]).data.template
    overrides = [
        "experiment=inspect",
        "model=smollm2",
        "data=passkey_synthetic",
        "data.sizes={eval: 4, importance: 2, heldout: 1, train: 0}",
        "data.context_lengths=[580]",
        "data.depths=[0.0,0.25,0.5,0.75]",
        "data.metric=accuracy",
        "data.eval_batch_size=2",
        "logger=none",
        *[f"data.template.{k}='{v}'" for k, v in classic.items()],
    ]
    task = load_passkey_task(compose_cfg(tmp_path, overrides))
    result = task.evaluate()
    assert result.score >= 75.0, result.per_example
    greedy = []
    for e in task.data.split("eval"):
        prompt = torch.tensor([e.ids[: e.answer_start]])
        with torch.no_grad():
            out = task.model.generate(input_ids=prompt, max_new_tokens=len(e.answer), do_sample=False, pad_token_id=task.data.pad_id)
        greedy.append(int(out[0, prompt.shape[1] :].tolist() == list(e.answer)))
    assert greedy == result.per_example["correct"]
    scores = retrieval_scores(task.model, task.gates, task.retrieval_batches(batch_size=1))["dec_self"]
    assert scores.max() > 0.5 and (scores > 0.1).float().mean() < 0.1
