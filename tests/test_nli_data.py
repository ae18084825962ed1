"""NLIDataModule: file formats, clear errors, splits, the importance subset, padding and length grouping."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
import torch

from headprune.tasks.nli.data import LengthGroupedSampler, NLIDataConfig, NLIDataModule
from headprune.tasks.nli.files import NLIDataError, read_split
from headprune.tasks.nli.synthetic import synthetic_splits


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from headprune.models.sources import resolve_pretrained

    return AutoTokenizer.from_pretrained(resolve_pretrained("minilm"))


def _rows(n, offset=0):
    labels = ["entailment", "neutral", "contradiction"]
    return [
        {"premise": f"A man number {i + offset} walks {'far ' * (i % 7)}away.", "hypothesis": f"Someone walks {i}.", "label": labels[i % 3]}
        for i in range(n)
    ]


def _write_jsonl(path, rows, gz=False):
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as handle:
            handle.write(text)
    else:
        path.write_text(text)
    return path


GLUE_HEADER = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
    "label1",
    "gold_label",
]


def data_values(values: dict) -> dict:
    """``values`` over conf/data/nli_local.yaml (and nli_<source>.yaml), as a composed config holds them."""
    from omegaconf import OmegaConf

    conf = Path(__file__).resolve().parents[1] / "conf" / "data"
    base = OmegaConf.load(conf / "nli_local.yaml")
    base.dir = None  # ${paths.data_dir} exists only in a composed config
    if values.get("source") in ("hub", "synthetic"):
        extra = OmegaConf.load(conf / f"nli_{values['source']}.yaml")
        extra.pop("defaults")
        base = OmegaConf.merge(base, extra)
    return OmegaConf.to_container(OmegaConf.merge(base, values))


def _write_glue_tsv(path, rows):
    lines = ["\t".join(GLUE_HEADER)]
    for i, r in enumerate(rows):
        lines.append(
            "\t".join([str(i), "1", f"{i}e", "fiction", "(x)", "(y)", "(X)", "(Y)", r["premise"], r["hypothesis"], r["label"], r["label"]])
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def _local(tmp_path, tokenizer, **kw):
    values = {"source": "local", "dir": str(tmp_path), "importance_size": 4, "batch_size": 4, "eval_batch_size": 5}
    values.update(kw)
    return NLIDataModule(NLIDataConfig.from_cfg(data_values(values)), tokenizer)


def test_jsonl_gzip_and_label_ids(tmp_path):
    rows = _rows(6)
    rows[1]["label"] = 2  # ids work as well as names
    rows[2]["label"] = "Neutral"
    data = read_split(_write_jsonl(tmp_path / "train.jsonl.gz", rows, gz=True))
    assert data["label"] == [0, 2, 1, 0, 1, 2]
    assert data["premise"][0] == rows[0]["premise"]


def test_glue_tsv_layout(tmp_path):
    rows = _rows(5)
    rows[3]["premise"] = 'He said "hi" and left'  # GLUE's TSVs contain bare quotes
    data = read_split(_write_glue_tsv(tmp_path / "dev_matched.tsv", rows))
    assert data["premise"][3] == 'He said "hi" and left'
    assert data["label"] == [0, 1, 2, 0, 1]


def test_malformed_json_row_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(_rows(1)[0]) + "\n{not json\n")
    with pytest.raises(NLIDataError, match=r"train\.jsonl:2: not valid JSON"):
        read_split(path)
    path.write_text(json.dumps({"premise": "a", "label": "neutral"}) + "\n")
    with pytest.raises(NLIDataError, match=r"train\.jsonl:1: missing field 'hypothesis'"):
        read_split(path)


def test_short_tsv_row_names_file_and_line(tmp_path):
    path = _write_glue_tsv(tmp_path / "train.tsv", _rows(3))
    path.write_text(path.read_text() + "7\tonly\tthree\n")
    with pytest.raises(NLIDataError, match=r"train\.tsv:5: expected 12 tab-separated columns"):
        read_split(path)


def test_unknown_label_lists_valid_ones(tmp_path):
    rows = _rows(3)
    rows[2]["label"] = "maybe"
    path = _write_jsonl(tmp_path / "train.jsonl", rows)
    with pytest.raises(
        NLIDataError, match=r"train\.jsonl:3: unknown label 'maybe'; valid labels are entailment \(0\), neutral \(1\), contradiction \(2\)"
    ):
        read_split(path)


def test_missing_split_says_which_file(tmp_path, tokenizer):
    _write_jsonl(tmp_path / "train.jsonl", _rows(20))
    dm = _local(tmp_path, tokenizer)
    with pytest.raises(FileNotFoundError, match=r"'eval' split: looked for dev_matched\.jsonl, dev_matched\.jsonl\.gz.*dev_matched\.tsv"):
        dm.setup()
    with pytest.raises(FileNotFoundError, match="does not exist"):
        _local(tmp_path / "nowhere", tokenizer).setup()


def test_bad_settings_are_rejected():
    with pytest.raises(NLIDataError, match=r"data.source='web' is not one of"):
        NLIDataConfig.from_cfg(data_values({"source": "web"}))
    with pytest.raises(NLIDataError, match=r"data.limit_train must be a positive integer or null"):
        NLIDataConfig.from_cfg(data_values({"source": "synthetic", "limit_train": -5}))
    with pytest.raises(NLIDataError, match=r"unknown data setting\(s\) \['batchsize'\]"):
        NLIDataConfig.from_cfg(data_values({"source": "synthetic", "batchsize": 8}))


def test_local_splits_limits_and_importance_holdout(tmp_path, tokenizer):
    _write_jsonl(tmp_path / "train.jsonl.gz", _rows(40), gz=True)
    _write_glue_tsv(tmp_path / "dev_matched.tsv", _rows(12, offset=100))
    _write_jsonl(tmp_path / "dev_mismatched.jsonl", _rows(9, offset=200))
    dm = _local(tmp_path, tokenizer, limit_train=30, limit_eval=10)
    dm.setup()
    assert dm.eval_splits == ["eval", "eval_mismatched"]
    sizes = {k: len(v) for k, v in dm.datasets.items()}
    assert sizes == {"train": 30, "importance": 4, "eval": 10, "eval_mismatched": 9}
    train, imp = dm.datasets["train"].texts["premise"], dm.datasets["importance"].texts["premise"]
    assert not set(train) & set(imp)  # held out of fine-tuning
    eval_texts = set(dm.datasets["eval"].texts["premise"]) | set(dm.datasets["eval_mismatched"].texts["premise"])
    assert not set(imp) & eval_texts  # never evaluation data
    # the subset is fixed: the same whatever limit_train is
    other = _local(tmp_path, tokenizer, limit_train=5)
    other.setup()
    assert other.datasets["importance"].texts["premise"] == imp


def test_dynamic_padding_and_eval_loader_order(tokenizer):
    dm = NLIDataModule(
        NLIDataConfig.from_cfg(
            data_values(
                {
                    "source": "synthetic",
                    "importance_size": 10,
                    "eval_batch_size": 64,
                    "synthetic": {"seed": 1, "train_size": 90, "eval_size": 60, "mismatched_size": 30},
                }
            )
        ),
        tokenizer,
    )
    seen = []
    for batch in dm.loader("eval"):
        lengths = batch["attention_mask"].sum(1)
        assert batch["input_ids"].shape[1] == int(lengths.max())  # padded to the longest in the batch only
        assert set(batch) >= {"input_ids", "attention_mask", "token_type_ids", "labels", "idx"}
        seen += batch["idx"].tolist()
    assert sorted(seen) == list(range(60))


def test_length_grouped_sampler_shards_and_groups():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(5, 120, (1000,), generator=gen).tolist()
    one = list(LengthGroupedSampler(lengths, batch_size=8, megabatch=10, seed=3))
    assert sorted(one) == list(range(1000))
    batches = [one[i : i + 8] for i in range(0, 1000, 8)]
    spread = sum(max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in batches) / len(batches)
    assert spread < 15  # random batches would spread over ~90
    ranks = [list(LengthGroupedSampler(lengths, batch_size=8, num_replicas=2, rank=r, seed=3)) for r in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 500 and not set(ranks[0]) & set(ranks[1])
    sampler = LengthGroupedSampler(lengths, batch_size=8, seed=3)
    sampler.set_epoch(1)
    assert list(sampler) != one  # a new order every epoch


def test_synthetic_is_deterministic_and_disjoint():
    a, b = (
        synthetic_splits(seed=5, train_size=300, eval_size=60, mismatched_size=30),
        synthetic_splits(seed=5, train_size=300, eval_size=60, mismatched_size=30),
    )
    assert a == b
    assert synthetic_splits(seed=6, train_size=300)["train"] != a["train"]
    pairs = set(zip(a["train"]["premise"], a["train"]["hypothesis"]))
    assert not pairs & set(zip(a["eval"]["premise"], a["eval"]["hypothesis"]))
    assert sorted(set(a["train"]["label"])) == [0, 1, 2]


def test_hub_source_maps_glue_splits(monkeypatch, tokenizer):
    import datasets

    asked = []

    def fake_load(path, name, split):
        asked.append((path, name, split))
        rows = _rows(30 if split == "train" else 6)
        return {
            "premise": [r["premise"] for r in rows],
            "hypothesis": [r["hypothesis"] for r in rows],
            "label": [["entailment", "neutral", "contradiction"].index(r["label"]) for r in rows],
        }

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    dm = NLIDataModule(NLIDataConfig.from_cfg(data_values({"source": "hub", "importance_size": 5})), tokenizer)
    dm.setup()
    assert ("nyu-mll/glue", "mnli", "validation_mismatched") in asked
    assert {k: len(v) for k, v in dm.datasets.items()} == {"train": 25, "importance": 5, "eval": 6, "eval_mismatched": 6}


def test_a_malformed_row_stops_the_cli_in_one_line(tmp_path, capsys, monkeypatch):
    """headprune on a data file with a bad row: exit 2 and one line naming the file and line, no traceback."""
    from cli_runs import headprune

    data = tmp_path / "data" / "mnli"
    data.mkdir(parents=True)
    _write_jsonl(data / "dev_matched.jsonl", _rows(8))
    (data / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(2)) + "{not json\n")
    status, err = headprune(
        capsys, monkeypatch, tmp_path, tmp_path / "run", "experiment=prune", "model=tiny_bert", "data=nli_local", "logger=none"
    )
    assert status == 2, err
    assert "train.jsonl:3: not valid JSON" in err and "Traceback" not in err
