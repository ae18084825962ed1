"""Bad inputs as a new user would give them: each is a clear error, in seconds, before any model forward.

Config rows compose the real ``conf/`` (tiny models, synthetic or tmp_path data) and run
``validate(cfg)``, the check the ``headprune`` entry point runs first; CLI rows run the entry point
in-process; API rows call a library function. Every row asserts the words of the error and the time.
Recovered rows are damaged files a resumed study repairs itself (it names them and recomputes them):
they pass validation.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import time
from pathlib import Path

import pytest
import torch
from experiment_helpers import BASES, NLI, compose_cfg

SECONDS = 10.0


# ---- files written to tmp_path ------------------------------------------------------------------


def write_mt(root: Path, fault: str | None = None) -> Path:
    """Aligned en/de files for train/valid/test (20 pairs each), with one ``fault`` when asked."""
    root.mkdir(parents=True, exist_ok=True)
    for split in ("train", "valid", "test"):
        for lang in ("en", "de"):
            lines = [f"{lang} sentence {i} of {split}" for i in range(20)]
            data = ("\n".join(lines) + "\n").encode()
            if fault == "misaligned" and (split, lang) == ("test", "de"):
                data = ("\n".join(lines[:-1]) + "\n").encode()
            if fault == "utf8" and (split, lang) == ("valid", "en"):
                data = data.replace(b"sentence 2 ", b"sent\xffence 2 ")
            if fault == "empty" and (split, lang) == ("test", "en"):
                data = data.replace(b"en sentence 1 of test\n", b"\n")
            (root / f"{split}.{lang}").write_bytes(data)
    return root


def write_nli(root: Path, fault: str | None = None) -> Path:
    """train.jsonl.gz (60 pairs) and dev_matched.jsonl (12), with one ``fault`` when asked."""
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"premise": f"a man walks {i}", "hypothesis": f"a person moves {i}", "label": i % 3} for i in range(60)]
    with gzip.open(root / "train.jsonl.gz", "wt", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in rows)
    dev = "".join(json.dumps(r) + "\n" for r in rows[:12]).encode()
    if fault == "utf8":
        lines = dev.split(b"\n")
        lines[3] = lines[3].replace(b"walks", b"walks \xe9")
        dev = b"\n".join(lines)
    (root / "dev_matched.jsonl").write_bytes(dev)
    return root


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    """A saved tiny BERT: complete, and with its tokenizer, weights or config removed."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from headprune.models.sources import resolve_pretrained

    root = tmp_path_factory.mktemp("models")
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(
            vocab_size=30522,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            num_labels=3,
            max_position_embeddings=128,
        )
    )
    tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained("minilm"))
    for name in ("complete", "no_tokenizer", "no_weights", "no_config"):
        model.save_pretrained(root / name)
        if name != "no_tokenizer":
            tokenizer.save_pretrained(root / name)
    (root / "no_weights" / "model.safetensors").unlink()
    (root / "no_config" / "config.json").unlink()
    return root


def mask_file(root: Path, value) -> Path:
    """A mask JSON for tiny_bert (2 layers x 4 heads) with one entry set to ``value``."""
    mask = [[1, 1, 1, 1], [1, 0, 1, 1]]
    mask[0][2] = value
    path = root / "mask.json"
    path.write_text(json.dumps({"mask": {"enc_self": mask}}))
    return path


# ---- config rows: overrides -> words of the error -----------------------------------------------

PRE = {  # a row's files, written before composing
    "mt": lambda tmp: write_mt(tmp / "mt"),
    "mt_misaligned": lambda tmp: write_mt(tmp / "mt", "misaligned"),
    "mt_utf8": lambda tmp: write_mt(tmp / "mt", "utf8"),
    "mt_empty": lambda tmp: write_mt(tmp / "mt", "empty"),
    "nli_utf8": lambda tmp: write_nli(tmp / "nli", "utf8"),
    "mask_half": lambda tmp: mask_file(tmp, 0.5),
    "mask_two": lambda tmp: mask_file(tmp, 2),
    "mask_text": lambda tmp: (tmp / "mask.json").write_text("{not json"),
    "mask_kv3": lambda tmp: (tmp / "mask.json").write_text(json.dumps({"mask": {"dec_self": [[1, 1, 0], [1, 1, 1]]}})),  # a third KV head
    "mask_kv_ok": lambda tmp: (tmp / "mask.json").write_text(json.dumps({"mask": {"dec_self": [[1, 0], [1, 1]]}})),
    "stage_corrupt": lambda tmp: ((tmp / "stages").mkdir(), (tmp / "stages" / "scores.json").write_text('{"complete": tr')),
    "train_corrupt": lambda tmp: ((tmp / "train").mkdir(), (tmp / "train" / "results.json").write_text("{")),
}
MT_FILES = ["data=mt_multi30k", "data.dir={tmp}/mt", "data.tokenizer.vocab_size=300"]

CONFIG_ROWS = [
    # (id, task, overrides, words, files)
    (
        "pretrained-without-tokenizer",
        "nli",
        ["experiment=prune", "model=minilm", "model.pretrained={models}/no_tokenizer"],
        "tokenizer files",
        None,
    ),
    ("tokenizer-dir-without-tokenizer", "nli", ["experiment=ablate", "model.tokenizer={models}/no_tokenizer"], "tokenizer files", None),
    ("pretrained-without-weights", "nli", ["experiment=ablate", "model=minilm", "model.pretrained={models}/no_weights"], "weights", None),
    ("pretrained-without-config", "nli", ["experiment=ablate", "model=minilm", "model.pretrained={models}/no_config"], "config.json", None),
    (
        "pretrained-relative-missing",
        "nli",
        ["experiment=ablate", "model=minilm", "model.pretrained=outputs/nope/train/model"],
        "not found",
        None,
    ),
    ("pretrained-dot-missing", "nli", ["experiment=ablate", "model=minilm", "model.pretrained=./nope"], "not found", None),
    (
        "pretrained-hub-offline",
        "nli",
        ["experiment=ablate", "model=minilm", "model.pretrained=no_such_dir"],
        "model.pretrained=<dir>",
        None,
    ),
    ("mt-ckpt-missing", "mt", ["experiment=ablate", "model.pretrained=runs/x/checkpoints/last.ckpt"], "not found", None),
    ("min-heads-above-layer", "nli", ["experiment=prune", "prune.min_heads_per_layer=20"], "min_heads_per_layer", None),
    ("min-heads-equal-layer", "nli", ["experiment=prune", "prune.min_heads_per_layer=4"], "at most 3", None),
    ("min-heads-negative", "nli", ["experiment=prune", "prune.min_heads_per_layer=-1"], "min_heads_per_layer", None),
    ("min-heads-study-minilm", "nli", ["experiment=study", "model=minilm", "prune.min_heads_per_layer=12"], "at most 11", None),
    ("mask-file-half", "nli", ["experiment=speed", "speed.mask_file={tmp}/mask.json"], "0.5", "mask_half"),
    ("mask-file-two", "nli", ["experiment=speed", "speed.mask_file={tmp}/mask.json"], "has 2", "mask_two"),
    ("mask-file-not-json", "nli", ["experiment=speed", "speed.mask_file={tmp}/mask.json"], "not valid JSON", "mask_text"),
    ("mask-file-missing", "nli", ["experiment=speed", "speed.mask_file={tmp}/none.json"], "does not exist", None),
    ("mt-limit-zero", "mt", ["experiment=ablate", "data.limits.test=0"], "data.limits.test", None),
    ("mt-limit-negative", "mt", ["experiment=ablate", "data.limits.test=-5"], "data.limits.test", None),
    ("mt-limit-valid-negative", "mt", ["experiment=keep_one", "data.limits.valid=-1"], "data.limits.valid", None),
    ("ablate-alpha-5", "nli", ["experiment=ablate", "ablate.alpha=5"], "ablate.alpha", None),
    ("ablate-alpha-0", "nli", ["experiment=ablate", "ablate.alpha=0"], "ablate.alpha", None),
    ("ablate-n-samples-0", "nli", ["experiment=ablate", "ablate.n_samples=0"], "ablate.n_samples", None),
    ("ablate-no-splits", "nli", ["experiment=ablate", "ablate.splits=[]"], "ablate.splits", None),
    ("ablate-unknown-split", "nli", ["experiment=ablate", "ablate.splits=[dev]"], "unknown split", None),
    ("logger-bogus-prune", "nli", ["experiment=prune", "logger.kind=bogus"], "logger.kind", None),
    ("logger-bogus-ablate", "mt", ["experiment=ablate", "logger.kind=bogus"], "logger.kind", None),
    ("study-ablation-split-unknown", "nli", ["experiment=study", "prune.ablation_split=dev"], "unknown split", None),
    ("study-selection-is-eval", "nli", ["experiment=study", "study.selection_split=eval"], "selection_split", None),
    ("keep-one-selection-is-eval", "nli", ["experiment=keep_one", "keep_one.selection_split=eval"], "same data", None),
    ("keep-one-mt-selection-is-test", "mt", ["experiment=keep_one", "keep_one.selection_split=test"], "same data", None),
    ("keep-one-alpha-1", "mt", ["experiment=keep_one", "keep_one.alpha=1"], "keep_one.alpha", None),
    ("mt-misaligned-ablate", "mt", ["experiment=ablate", *MT_FILES], "test.de has 19", "mt_misaligned"),
    ("mt-utf8-keep-one", "mt", ["experiment=keep_one", *MT_FILES], "valid.en:3: not valid UTF-8", "mt_utf8"),
    ("mt-empty-line-ablate", "mt", ["experiment=ablate", *MT_FILES], "empty lines at line 2", "mt_empty"),
    ("mt-train-misaligned-test", "mt", ["experiment=mt_train", "model=tiny_marian", *MT_FILES], "test.de", "mt_misaligned"),
    ("mt-missing-dir", "mt", ["experiment=ablate", "data=mt_multi30k", "data.dir={tmp}/nothing"], "does not exist", None),
    ("mt-train-epochs-forever", "mt", ["experiment=mt_train", "model=tiny_marian", "trainer.max_epochs=-1"], "max_steps", None),
    ("mt-train-epochs-zero", "mt", ["experiment=mt_train", "model=tiny_marian", "trainer.max_epochs=0"], "trains nothing", None),
    ("nli-finetune-epochs-forever", "nli", ["experiment=nli_finetune", "trainer.max_epochs=-1"], "max_time", None),
    ("prune-fractions-text", "nli", ["experiment=prune", "prune.fractions=abc"], "prune.fractions must be a number", None),
    ("prune-fractions-one", "nli", ["experiment=prune", "prune.fractions=[0.5,1.0]"], "prune.fractions", None),
    ("prune-fractions-negative", "nli", ["experiment=prune", "prune.fractions=[-0.1]"], "prune.fractions", None),
    ("prune-step-zero", "mt", ["experiment=prune", "prune.step=0"], "prune.step", None),
    ("prune-order-bogus", "nli", ["experiment=prune", "prune.order=magnitude"], "prune.order", None),
    ("prune-n-samples-0", "nli", ["experiment=prune", "prune.n_samples=0"], "prune.n_samples", None),
    ("prune-target-speedup-one", "nli", ["experiment=prune", "prune.target={{speedup:1.0}}"], "must be > 1", None),
    ("prune-target-speedup-below-one", "nli", ["experiment=prune", "prune.target={{speedup:0.8}}"], "prune.target", None),
    ("prune-target-flops-zero", "nli", ["experiment=prune", "prune.target={{flops:0}}"], "(0, 1]", None),
    ("prune-target-flops-above-one", "mt", ["experiment=prune", "prune.target={{flops:1.5}}"], "(0, 1]", None),
    ("prune-target-drop-negative", "nli", ["experiment=prune", "prune.target={{max_drop:-1}}"], "must be >= 0", None),
    ("prune-target-two-at-once", "nli", ["experiment=prune", "prune.target={{speedup:1.3,flops:0.6}}"], "exactly one", None),
    ("prune-target-not-a-mapping", "nli", ["experiment=prune", "prune.target=1.3"], "a mapping with one key", None),
    ("prune-target-text", "nli", ["experiment=prune", "prune.target={{speedup:fast}}"], "finite number", None),
    ("prune-target-and-schedule", "nli", ["experiment=prune", "prune.target={{speedup:1.3}}", "prune.schedule=[0.2]"], "not both", None),
    ("prune-schedule-shrinking", "nli", ["experiment=prune", "prune.schedule=[0.4,0.2]"], "grow", None),
    ("prune-schedule-empty", "nli", ["experiment=prune", "prune.schedule=[]"], "empty", None),
    ("prune-schedule-bad-target", "nli", ["experiment=prune", "prune.schedule=[{{speedup:1.2}},{{speedup:0.9}}]"], "must be > 1", None),
    (
        "prune-flops-target-latency-cost",
        "nli",
        ["experiment=prune", "prune.target={{flops:0.6}}", "prune.cost=latency"],
        "prune.cost=flops",
        None,
    ),
    ("prune-cost-bogus", "nli", ["experiment=prune", "prune.cost=energy"], "prune.cost", None),
    ("prune-recover-bogus", "nli", ["experiment=prune", "prune.recover=retrain"], "prune.recover", None),
    ("prune-recover-list-bogus", "mt", ["experiment=prune", "prune.recover=[lsq,magic]"], "prune.recover", None),
    ("prune-recover-examples-zero", "nli", ["experiment=prune", "prune.recover_examples=0"], "prune.recover_examples", None),
    ("prune-rearrange-bogus", "nli", ["experiment=prune", "prune.rearrange=always"], "prune.rearrange must be false, true or both", None),
    ("prune-rearrange-schedule", "nli", ["experiment=prune", "prune.rearrange=true", "prune.schedule=[0.2,0.4]"], "not with", None),
    ("prune-finetune-steps-zero", "nli", ["experiment=prune", "prune.finetune.max_steps=0"], "prune.finetune.max_steps", None),
    ("prune-finetune-distill-two", "nli", ["experiment=prune", "prune.finetune.distill_weight=2"], "prune.finetune.distill_weight", None),
    ("prune-finetune-temperature-zero", "nli", ["experiment=prune", "prune.finetune.temperature=0"], "prune.finetune.temperature", None),
    (
        "prune-max-drop-on-eval",
        "nli",
        ["experiment=prune", "prune.target={{max_drop:1.0}}", "prune.selection_split=eval"],
        "same data",
        None,
    ),
    (
        "prune-max-drop-mt-on-test",
        "mt",
        ["experiment=prune", "prune.target={{max_drop:1.0}}", "prune.selection_split=test"],
        "same data",
        None,
    ),
    (
        "prune-measure-speed-bad-batch",
        "nli",
        ["experiment=prune", "prune.measure_speed=true", "speed.batch_sizes=[0]"],
        "speed.batch_sizes",
        None,
    ),
    ("study-target-flops-zero", "nli", ["experiment=study", "prune.target={{flops:0}}"], "(0, 1]", None),
    ("study-recover-bogus", "mt", ["experiment=study", "prune.recover=retrain"], "prune.recover", None),
    ("nli-utf8", "nli", ["experiment=ablate", "data=nli_local", "data.dir={tmp}/nli"], "dev_matched.jsonl:4: not valid UTF-8", "nli_utf8"),
    ("nli-missing-dir", "nli", ["experiment=prune", "data=nli_local", "data.dir={tmp}/nothing"], "does not exist", None),
    ("nli-limit-eval-zero", "nli", ["experiment=ablate", "data.limit_eval=0"], "data.limit_eval", None),
    ("nli-batch-size-zero", "nli", ["experiment=ablate", "data.batch_size=0"], "data.batch_size", None),
    ("study-batch-sizes-zero", "nli", ["experiment=study", "speed.batch_sizes=[0]"], "speed.batch_sizes", None),
    ("speed-batch-sizes-empty", "nli", ["experiment=speed", "speed.batch_sizes=[]"], "speed.batch_sizes", None),
    ("speed-clock-bogus", "nli", ["experiment=speed", "speed.clock=bogus"], "speed.clock", None),
    ("study-clock-bogus", "mt", ["experiment=study", "speed.clock=bogus"], "speed.clock", None),
    ("speed-fraction-one", "nli", ["experiment=speed", "speed.fraction=1.0"], "speed.fraction", None),
    ("speed-examples-zero", "nli", ["experiment=speed", "speed.examples=0"], "speed.examples", None),
    ("speed-repeats-zero", "mt", ["experiment=speed", "speed.repeats=0"], "speed.repeats", None),
    ("speed-tolerance-zero", "nli", ["experiment=speed", "speed.tolerance=0"], "speed.tolerance", None),
    ("speed-max-seconds-negative", "nli", ["experiment=speed", "speed.max_seconds=-1"], "speed.max_seconds", None),
    ("importance-reduce-bogus", "nli", ["experiment=prune", "importance.reduce=mean"], "importance.reduce", None),
    ("model-kind-bogus", "nli", ["experiment=ablate", "model.kind=decoder"], "model.kind", None),
    ("model-neither", "nli", ["experiment=ablate", "model.config=null"], "neither", None),
    ("model-data-mismatch", "nli", ["experiment=ablate", "data=mt_synthetic"], "does not fit", None),
    ("seed-text", "nli", ["experiment=ablate", "seed=abc"], "seed", None),
    ("unit-bogus", "lm", ["experiment=prune", "prune.unit=layer"], "prune.unit", None),
    (
        "unit-kv-group-without-gqa",
        "lm",
        ["experiment=prune", "prune.unit=kv_group", "model.config.num_key_value_heads=4"],
        "grouped-query attention",
        None,
    ),
    ("unit-kv-group-encoder", "nli", ["experiment=ablate", "prune.unit=kv_group"], "grouped-query attention", None),
    (
        "unit-kv-group-with-latency-costs",
        "lm",
        ["experiment=prune", "prune.unit=kv_group", "prune.target={{speedup:1.3}}", "prune.cost=latency"],
        "prune.cost=flops with prune.unit=kv_group",
        None,
    ),
    (
        "unit-kv-group-speed-mask-kv-out-of-range",
        "lm",
        ["experiment=speed", "prune.unit=kv_group", "speed.mask_file={tmp}/mask.json"],
        "within 0..1",
        "mask_kv3",
    ),
    ("unit-head-speed-mask-is-kv-shaped", "lm", ["experiment=speed", "speed.mask_file={tmp}/mask.json"], "4 heads", "mask_kv_ok"),
    ("lm-decode-tokens-zero", "lm", ["experiment=speed", "task.decode_tokens=0"], "task.decode_tokens", None),
    ("lm-selection-is-eval", "lm", ["experiment=keep_one", "task.selection_split=eval"], "task.selection_split", None),
    ("lm-min-heads-kv-group", "lm", ["experiment=prune", "prune.unit=kv_group", "prune.min_heads_per_layer=2"], "at most 1", None),
]


def compose_row(tmp_path, task: str, overrides: list[str], models: Path | None = None):
    """The task's tiny base overrides, minus those a row replaces, plus the row's own."""
    given = [o.format(tmp=tmp_path, models=models) for o in overrides]
    keys = {o.split("=")[0].lstrip("+") for o in given}
    base = [
        "+" + o if o.startswith("+") else o
        for o in BASES[task]  # ++: add or override
        if o.split("=")[0].lstrip("+") not in keys and not (o.startswith("data.") and "data" in keys)
    ]
    return compose_cfg(tmp_path, [*base, "++device=cpu", "logger=none", *given])


@pytest.fixture
def no_forward(monkeypatch):
    """Any module forward fails the test: the errors must come before any model runs."""

    def forbidden(self, *args, **kwargs):
        raise AssertionError(f"{type(self).__name__} ran a forward pass before the error")

    monkeypatch.setattr(torch.nn.Module, "__call__", forbidden)


@pytest.mark.parametrize("task,overrides,words,files", [pytest.param(*row[1:], id=row[0]) for row in CONFIG_ROWS])
def test_config_error(tmp_path, model_dirs, no_forward, monkeypatch, task, overrides, words, files):
    from headprune.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    if files:
        PRE[files](tmp_path)
    start = time.perf_counter()
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        validate(compose_row(tmp_path, task, overrides, model_dirs))
    assert words in str(err.value), str(err.value)
    assert time.perf_counter() - start < SECONDS


def test_unknown_target_kind_is_refused_when_composed(tmp_path):
    """``prune.target`` has the three kinds as keys: another key is refused by Hydra, naming it."""
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException) as err:
        compose_cfg(tmp_path, ["experiment=prune", "prune.target={latency:2}"])
    assert "latency" in str(err.value.__cause__ or err.value)


def test_nested_target_override_is_the_mapping_form(tmp_path):
    from headprune.validation import unset_empty_target

    nested = compose_cfg(tmp_path, ["experiment=prune", "prune.target.speedup=1.3"])
    mapping = compose_cfg(tmp_path, ["experiment=prune", "prune.target={speedup:1.3}"])
    unset = compose_cfg(tmp_path, ["experiment=prune"])
    for cfg in (nested, mapping, unset):
        unset_empty_target(cfg)
    assert dict(nested.prune.target) == dict(mapping.prune.target) and nested.prune.target.speedup == 1.3
    assert unset.prune.target is None


# ---- recovered rows: a resumed study names a damaged stage file and recomputes it ---------------

RECOVERED_ROWS = [  # (id, files): validation lets these through; tests/test_study_resume.py shows the recomputation
    ("study-stage-corrupt", "stage_corrupt"),
    ("study-train-results-corrupt", "train_corrupt"),
]


@pytest.mark.parametrize("files", [pytest.param(row[1], id=row[0]) for row in RECOVERED_ROWS])
def test_recovered_input_passes_validation(tmp_path, model_dirs, no_forward, monkeypatch, files):
    from headprune.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    PRE[files](tmp_path)
    validate(compose_row(tmp_path, "nli", ["experiment=study"], model_dirs))


# ---- CLI rows: the entry point runs validate() before the experiment -----------------------------

CLI_ROWS = [
    ("cli-logger-bogus", ["experiment=prune", "logger.kind=bogus"], "logger.kind"),
    ("cli-ablate-alpha", ["experiment=ablate", "ablate.alpha=5"], "ablate.alpha"),
    ("cli-min-heads", ["experiment=prune", "prune.min_heads_per_layer=20"], "min_heads_per_layer"),
    ("cli-pretrained-relative", ["experiment=ablate", "model.pretrained=outputs/nope/train/model"], "not found"),
    ("cli-study-batch-zero", ["experiment=study", "speed.batch_sizes=[0]"], "speed.batch_sizes"),
    ("cli-prune-speedup-one", ["experiment=prune", "prune.target={speedup:1}"], "must be > 1"),
    ("cli-prune-two-targets", ["experiment=prune", "prune.target={speedup:1.3,max_drop:1}"], "exactly one"),
]


@pytest.mark.parametrize("overrides,words", [pytest.param(*row[1:], id=row[0]) for row in CLI_ROWS])
def test_cli_error(tmp_path, no_forward, monkeypatch, overrides, words):
    from headprune import cli

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    argv = [
        "headprune",
        *[o for o in NLI if not o.startswith("data.")],
        "data.synthetic.train_size=240",
        "logger=none",
        "device=cpu",
        *overrides,
        f"hydra.run.dir={tmp_path}/run",
        f"paths.data_dir={tmp_path}/data",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    start = time.perf_counter()
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        cli.main()
    assert words in str(err.value), str(err.value)
    assert time.perf_counter() - start < SECONDS


# ---- API rows --------------------------------------------------------------------------------------


def _mt_limit(tmp_path):
    from omegaconf import OmegaConf

    from headprune.tasks.mt.data import load_texts

    load_texts(
        OmegaConf.create(
            {
                "source": "files",
                "dir": str(write_mt(tmp_path / "mt")),
                "splits": {"test": "test"},
                "src_lang": "en",
                "tgt_lang": "de",
                "limits": {"test": -5},
            }
        ),
        "test",
    )


def _read_aligned_utf8(tmp_path):
    from headprune.tasks.mt.files import read_aligned

    read_aligned(write_mt(tmp_path / "mt", "utf8"), "valid", "en", "de")


def _read_jsonl_utf8(tmp_path):
    from headprune.tasks.nli.files import read_jsonl

    read_jsonl(write_nli(tmp_path / "nli", "utf8") / "dev_matched.jsonl")


def _resolve_relative(tmp_path):
    from headprune.models.sources import resolve_pretrained

    resolve_pretrained("outputs/nope/train/model")


def _hub_unreachable(tmp_path):
    """No HF_HUB_OFFLINE, but the hub's host refuses connections: a hub name fails at once."""
    from huggingface_hub import constants

    from headprune.models.sources import resolve_pretrained

    os.environ.pop("HF_HUB_OFFLINE", None)
    offline, endpoint = constants.HF_HUB_OFFLINE, constants.ENDPOINT
    constants.HF_HUB_OFFLINE, constants.ENDPOINT = False, "http://127.0.0.1:9"
    try:
        resolve_pretrained("no_such_dir")
    finally:
        constants.HF_HUB_OFFLINE, constants.ENDPOINT = offline, endpoint


def _tokenizer_missing(tmp_path):
    from omegaconf import OmegaConf

    from headprune.models.build import build_tokenizer

    (tmp_path / "empty_model").mkdir()
    (tmp_path / "empty_model" / "config.json").write_text("{}")
    build_tokenizer(OmegaConf.create({"name": "x", "tokenizer": str(tmp_path / "empty_model")}))


def _greedy_floor(tmp_path):
    from headprune.selection.greedy import greedy_mask

    greedy_mask([("enc_self", 0, 0)], {"enc_self": (2, 4)}, 1, min_per_layer=20)


def _read_json_corrupt(tmp_path):
    from headprune.results.writer import read_json

    (tmp_path / "results.json").write_text('{"a": ')
    read_json(tmp_path / "results.json")


def _tiny_gates():
    from conftest import tiny_bert

    from headprune.core.gates import HeadGates

    model = tiny_bert()
    return model, HeadGates(model)


def _set_mask_nan(tmp_path):
    _, gates = _tiny_gates()
    gates.set_mask({"enc_self": torch.tensor([[1.0, float("nan"), 1, 1]] * 3)})


def _prune_head_id_fraction(tmp_path):
    from headprune.core.pruning import prune_heads

    model, _ = _tiny_gates()
    prune_heads(model, {"enc_self": {"0": [1.7]}})


def _prune_mask_half(tmp_path):
    from headprune.core.pruning import prune_mask

    model, _ = _tiny_gates()
    prune_mask(model, {"enc_self": torch.tensor([[1.0, 0.5, 1, 1]] * 3)})


def _prune_mask_shape(layers, heads):
    def call(tmp_path):
        from headprune.core.pruning import prune_mask

        model, _ = _tiny_gates()
        prune_mask(model, {"enc_self": torch.ones(layers, heads)})

    return call


def _edited_record(tmp_path):
    from headprune.core.pruning import prune_heads
    from headprune.core.saving import load_pruned, save_pruned

    model, _ = _tiny_gates()
    prune_heads(model, {"enc_self": {"0": [1]}})
    save_pruned(model, tmp_path / "pruned")
    for name, key in (("config.json", "headprune_pruned_heads"), ("headprune_pruning.json", "pruned_heads")):
        path = tmp_path / "pruned" / name
        saved = json.loads(path.read_text())
        saved[key] = {"enc_self": {"0": [2]}}  # the same count, another head
        path.write_text(json.dumps(saved))
    load_pruned(tmp_path / "pruned")


def _gguf_missing(tmp_path):
    """validate() on model=smollm2 with no converted copy and no gguf package: the error comes before any conversion."""
    from headprune.validation import validate

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HEADPRUNE_CACHE", str(tmp_path / "cache"))
        patch.setitem(sys.modules, "gguf", None)  # import gguf raises ImportError
        validate(compose_row(tmp_path, "lm", ["experiment=prune", "model=smollm2", "data=lm_synthetic"]))


def _unit_gates_without_gqa(tmp_path):
    from transformers import BertConfig, BertModel

    from headprune.core.gates import HeadGates
    from headprune.core.units import unit_gates

    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16))
    unit_gates(HeadGates(model), "kv_group")


API_ROWS = [
    pytest.param(_mt_limit, "data.limits.test", id="api-load-texts-negative-limit"),
    pytest.param(_read_aligned_utf8, "valid.en:3", id="api-read-aligned-utf8"),
    pytest.param(_read_jsonl_utf8, "dev_matched.jsonl:4", id="api-read-jsonl-utf8"),
    pytest.param(_resolve_relative, "not found", id="api-resolve-relative-path"),
    pytest.param(_hub_unreachable, "cannot be reached", id="api-hub-name-no-network"),
    pytest.param(_tokenizer_missing, "tokenizer files", id="api-build-tokenizer-without-files"),
    pytest.param(_greedy_floor, "min_heads_per_layer", id="api-greedy-floor-above-heads"),
    pytest.param(_read_json_corrupt, "results.json is not valid JSON", id="api-read-json-corrupt"),
    pytest.param(_set_mask_nan, "NaN", id="api-set-mask-nan"),
    pytest.param(_prune_head_id_fraction, "1.7", id="api-prune-head-id-fraction"),
    pytest.param(_prune_mask_half, "0.5", id="api-prune-mask-half"),
    pytest.param(_prune_mask_shape(2, 4), "shape", id="api-prune-mask-too-few-layers"),
    pytest.param(_prune_mask_shape(3, 5), "shape", id="api-prune-mask-too-many-heads"),
    pytest.param(_edited_record, "SHA-256", id="api-edited-pruning-record"),
    pytest.param(_gguf_missing, "pip install gguf", id="api-validate-embedded-llm-without-gguf"),
    pytest.param(_unit_gates_without_gqa, "grouped-query attention", id="api-kv-group-unit-without-gqa"),
]


@pytest.mark.parametrize("call,words", API_ROWS)
def test_api_error(tmp_path, no_forward, monkeypatch, call, words):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises((ValueError, FileNotFoundError, IndexError, TypeError)) as err:
        call(tmp_path)
    assert words in str(err.value), str(err.value)
    assert time.perf_counter() - start < SECONDS


def test_table_is_complete():
    """At least 40 bad inputs, each with its own id (recovered rows included)."""
    ids = [row[0] for row in CONFIG_ROWS + RECOVERED_ROWS] + [row[0] for row in CLI_ROWS] + [p.id for p in API_ROWS]
    assert len(ids) >= 40 and len(ids) == len(set(ids))
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by conftest: nothing loads from the hub
