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
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from experiment_helpers import BASES, NLI, ROOT, compose_cfg

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


def full_mask_file(root: Path, value: int) -> Path:
    """A mask JSON for tiny_bert whose every entry is ``value`` (0: every head removed, 1: none)."""
    path = root / "mask.json"
    path.write_text(json.dumps({"mask": {"enc_self": [[value] * 4, [value] * 4]}}))
    return path


def prune_results_file(root: Path) -> Path:
    """A prune results.json for tiny_bert: the importance order at fractions 0 and 0.25."""
    steps = [
        {"fraction": 0.0, "mask": {"enc_self": [[1, 1, 1, 1], [1, 1, 1, 1]]}},
        {"fraction": 0.25, "mask": {"enc_self": [[1, 0, 1, 1], [1, 1, 0, 1]]}},
    ]
    path = root / "prune.json"
    path.write_text(json.dumps({"results": {"orders": {"importance": {"steps": steps}}}}))
    return path


def pareto_results_file(root: Path) -> Path:
    """A prune results.json for tiny_bert with two Pareto points at 25%: the mask alone (no model kept, as under
    prune.save=recovered) and its lsq recovery (a model kept)."""
    mask = {"enc_self": [[1, 0, 1, 1], [1, 1, 0, 1]]}
    point = {"order": "importance", "step": "25%", "fraction": 0.25, "mask": mask, "units_removed": 2, "units_total": 8}
    points = [{**point, "recovery": "none"}, {**point, "recovery": "lsq", "model_dir": "models/importance+lsq@25pct"}]
    path = root / "pareto.json"
    path.write_text(json.dumps({"results": {"unit": "head", "points": points}}))
    return path


def truncated_checkpoint(path: Path) -> Path:
    """A training checkpoint cut in half (a copy interrupted, a disk that filled up)."""
    torch.save({"state_dict": {"model.w": torch.zeros(64, 64)}}, path)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    return path


def write_lm(root: Path, fault: str) -> Path:
    """eval.txt, importance.txt and heldout.txt (one text per line), with an empty importance file or a bad byte."""
    root.mkdir(parents=True, exist_ok=True)
    for split in ("eval", "importance", "heldout"):
        data = "".join(f"a {split} text number {i}\n" for i in range(8)).encode()
        if fault == "empty" and split == "importance":
            data = b"\n\n"
        if fault == "utf8" and split == "heldout":
            data = data.replace(b"number 2", b"num\xffber 2")
        (root / f"{split}.txt").write_bytes(data)
    rows = [json.dumps({"premise": f"a premise number {i}", "label": "neutral"}) for i in range(4)]
    if fault == "json_bad":
        rows[2] = '{"premise": "a cut row'
    if fault == "json_field":
        rows[1] = json.dumps({"text": "a row without a premise"})
    (root / "train.jsonl").write_text("\n".join(rows) + "\n")
    return root


def write_haystack(root: Path, fault: str) -> Path:
    """eval.txt, importance.txt and heldout.txt haystacks (one sentence per line), the heldout one empty."""
    root.mkdir(parents=True, exist_ok=True)
    for split in ("eval", "importance", "heldout"):
        data = "".join(f"a {split} sentence number {i}.\n" for i in range(20)).encode()
        if fault == "empty" and split == "heldout":
            data = b"\n \n"
        (root / f"{split}.txt").write_bytes(data)
    return root


def write_image_folder(root: Path, counts: dict[str, int]) -> Path:
    """One subfolder of small PNG images per class (``counts``: class name -> images)."""
    from PIL import Image

    for index, (name, count) in enumerate(counts.items()):
        (root / name).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (10, 10), (20 * i % 256, 60 * index % 256, 0)).save(root / name / f"{i}.png")
    return root


def saved_vit(root: Path) -> Path:
    """A tiny ViT of 3 classes saved by headprune with its 16x16 image processor."""
    from tiny_encoders import tiny_vit
    from transformers import ViTImageProcessorPil

    from headprune.core.saving import save_pruned

    return save_pruned(tiny_vit(), root, tokenizer=ViTImageProcessorPil(size={"height": 16, "width": 16}))


def saved_model(root: Path, config, truncate: bool = False) -> Path:
    """A random model of ``config`` saved with save_pretrained; ``truncate``: its weights cut in half."""
    from transformers import AutoModel

    AutoModel.from_config(config).save_pretrained(root)
    if truncate:
        weights = root / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return root


def tiny_llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def tiny_bert_config():  # the layout of model_dirs' tiny BERT
    from transformers import BertConfig

    return BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)


def epoch_checkpoints(run: Path) -> Path:
    """A training run's checkpoints folder: a whole first epoch checkpoint and a truncated second one."""
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("seed: 0\n")
    (run / "checkpoints").mkdir()
    torch.save({"state_dict": {}}, run / "checkpoints" / "epoch000-step10.ckpt")
    truncated_checkpoint(run / "checkpoints" / "epoch001-step20.ckpt")
    return run / "checkpoints"


def foreign_model_dir(root: Path, model_type: str) -> Path:
    """A model directory whose config.json names ``model_type`` (weights present)."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"model_type": model_type, "architectures": ["FoobarForSequenceClassification"]}))
    (root / "model.safetensors").write_bytes(b"")
    return root


def saved_bpe_tokenizer(folder: Path) -> Path:
    """A byte-level BPE tokenizer trained here and saved: llama.cpp's converter has no name for it."""
    from headprune.models.tokenizers import train_tokenizer

    train_tokenizer([f"a text number {i} about tokens" for i in range(40)], vocab_size=300).save_pretrained(folder)
    return folder


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
    "mask_none_kept": lambda tmp: full_mask_file(tmp, 0),
    "mask_all_kept": lambda tmp: full_mask_file(tmp, 1),
    "prune_results": prune_results_file,
    "pareto_results": pareto_results_file,
    "lm_empty": lambda tmp: write_lm(tmp / "lm", "empty"),
    "ckpt_truncated": lambda tmp: truncated_checkpoint(tmp / "last.ckpt"),
    "lm_utf8": lambda tmp: write_lm(tmp / "lm", "utf8"),
    "lm_json": lambda tmp: write_lm(tmp / "lm", "none"),
    "lm_json_bad": lambda tmp: write_lm(tmp / "lm", "json_bad"),
    "lm_json_field": lambda tmp: write_lm(tmp / "lm", "json_field"),
    "mask_empty": lambda tmp: (tmp / "mask.json").write_text(""),
    "mask_garbage": lambda tmp: (tmp / "mask.json").write_text("enc_self: 1 1 0 1"),
    "mask_truncated": lambda tmp: (tmp / "mask.json").write_text('{"mask": {"enc_self": [[1, 1, 0, 1], [1, 1'),
    "mask_bare": lambda tmp: (tmp / "mask.json").write_text(json.dumps({"enc_self": [[1, 1, 0, 1], [1, 1, 1, 1]]})),
    "mask_list": lambda tmp: (tmp / "mask.json").write_text(json.dumps([[1, 1, 0, 1], [1, 1, 1, 1]])),
    "ablate_results": lambda tmp: (tmp / "mask.json").write_text(json.dumps({"experiment": "ablate", "results": {"splits": {}}})),
    "prior_run": lambda tmp: ((tmp / "prior").mkdir(), (tmp / "prior" / "results.json").write_text("{}")),
    "run_damaged": lambda tmp: ((tmp / "prior").mkdir(), (tmp / "prior" / "results.json").write_text('{"results": {"sco')),
    "run_list": lambda tmp: ((tmp / "prior").mkdir(), (tmp / "prior" / "results.json").write_text("[]")),
    "images_one_class": lambda tmp: write_image_folder(tmp / "images", {"cat": 12}),
    "images_one_rare": lambda tmp: write_image_folder(tmp / "images", {"cat": 12, "dog": 12, "owl": 1}),
    "vit_saved": lambda tmp: saved_vit(tmp / "vit3"),
    "foobar_dir": lambda tmp: foreign_model_dir(tmp / "foobar", "foobar"),
    "llama_dir": lambda tmp: saved_model(tmp / "llama", tiny_llama_config()),
    "bert_truncated": lambda tmp: saved_model(tmp / "bert", tiny_bert_config(), truncate=True),
    "epochs_truncated": lambda tmp: epoch_checkpoints(tmp / "run"),
    "mask_kv_ok_tokenizer": lambda tmp: (PRE["mask_kv_ok"](tmp), saved_bpe_tokenizer(tmp / "tok")),
    "mask_dec_heads": lambda tmp: (tmp / "mask.json").write_text(json.dumps({"mask": {"dec_self": [[1, 1, 0, 0], [1, 1, 1, 1]]}})),
    "mask_dec_three": lambda tmp: (tmp / "mask.json").write_text(json.dumps({"mask": {"dec_self": [[1, 1, 1, 0], [1, 1, 1, 1]]}})),
    "haystack_empty": lambda tmp: write_haystack(tmp / "hay", "empty"),
    "scored_results": lambda tmp: (tmp / "scored.json").write_text(
        json.dumps(
            {
                "results": {
                    "action": "remove",
                    "unit": "head",
                    "orders": {"importance": {"steps": [], "head_scores": {"dec_self": [[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]]}}},
                }
            }
        )
    ),
    "stream_results": lambda tmp: (tmp / "stream.json").write_text(
        json.dumps(
            {
                "results": {
                    "action": "stream",
                    "unit": "kv_group",
                    "orders": {"importance": {"steps": [{"fraction": 0.5, "mask": {"dec_self": [[0, 1], [0, 1]]}}]}},
                }
            }
        )
    ),
}
MT_FILES = ["data=mt_multi30k", "data.dir={tmp}/mt", "data.tokenizer.vocab_size=300"]
LM_FILES = [
    "data=lm_local",
    "data.dir={tmp}/lm",
    "data.files.eval=[eval.txt]",
    "data.files.importance=[importance.txt]",
    "data.files.heldout=[heldout.txt]",
    "data.files.eval_other=null",
    "data.files.train=null",
    "data.max_length=64",
    "data.tokenizer.vocab_size=200",
]
LM_JSON_FILES = [*LM_FILES, "data.files.train=[train.jsonl]"]  # LM_FILES with a JSON-lines training file
HAYSTACK_FILES = [
    "data=passkey_local",
    "data.dir={tmp}/hay",
    "data.files.eval=[eval.txt]",
    "data.files.importance=[importance.txt]",
    "data.files.heldout=[heldout.txt]",
    "data.files.train=null",
    "data.sizes.train=0",
    "data.context_lengths=[96]",
    "data.tokenizer.vocab_size=300",
]

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
    ("min-units-above-layer", "nli", ["experiment=prune", "prune.min_units_per_layer=20"], "min_units_per_layer", None),
    ("min-units-equal-layer", "nli", ["experiment=prune", "prune.min_units_per_layer=4"], "at most 3", None),
    ("min-units-negative", "nli", ["experiment=prune", "prune.min_units_per_layer=-1"], "min_units_per_layer", None),
    ("min-heads-old-key", "nli", ["experiment=prune", "+prune.min_heads_per_layer=1"], "is now prune.min_units_per_layer", None),
    ("min-units-study-minilm", "nli", ["experiment=study", "model=minilm", "prune.min_units_per_layer=12"], "at most 11", None),
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
    ("prune-target-flops-zero", "nli", ["experiment=prune", "prune.target={{flops:0}}"], "(0, 1)", None),
    ("prune-target-flops-above-one", "mt", ["experiment=prune", "prune.target={{flops:1.5}}"], "(0, 1)", None),
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
    ("prune-target-bytes-zero", "lm", ["experiment=prune", "prune.target={{bytes:0}}", "prune.cost=bytes"], "(0, 1)", None),
    ("prune-target-bytes-above-one", "lm", ["experiment=prune", "prune.target={{bytes:1.5}}", "prune.cost=bytes"], "(0, 1)", None),
    (
        "prune-bytes-target-flops-cost",
        "lm",
        ["experiment=prune", "prune.target={{bytes:0.75}}"],
        "a bytes target keeps a share of the model's weight bytes a decoded token reads, and prune.cost=flops predicts FLOPs",
        None,
    ),
    (
        "prune-flops-target-bytes-cost",
        "lm",
        ["experiment=prune", "prune.target={{flops:0.6}}", "prune.cost=bytes"],
        "add prune.cost=flops",
        None,
    ),
    (
        "prune-bytes-cost-encoder-decoder",
        "mt",
        ["experiment=prune", "prune.target={{bytes:0.75}}", "prune.cost=bytes"],
        "is an encoder-decoder: its encoder's weights are read once per source",
        None,
    ),
    (
        "prune-bytes-cost-streamed",
        "lm",
        ["experiment=prune", "prune.action=stream", "prune.unit=kv_group", "prune.cost=bytes"],
        "prune.action=stream keeps every weight",
        None,
    ),
    (
        "prune-schedule-bytes-twice",
        "lm",
        ["experiment=prune", "prune.cost=bytes", "prune.schedule=[{{bytes:0.8}},{{bytes:0.8}}]"],
        "already met by the step before it (bytes=0.8): a schedule must go further at every step (shrinking bytes shares)",
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
        "prune-finetune-layer-distill-negative",
        "nli",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.layer_distill=-1"],
        "prune.finetune.layer_distill",
        None,
    ),
    (
        "prune-layer-loss-bogus",
        "nli",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.layer_distill=1.0", "prune.finetune.layer_loss=layer"],
        "prune.finetune.layer_loss",
        None,
    ),
    (
        "prune-layer-loss-without-layer-distill",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.layer_loss=token"],
        "prune.finetune.layer_loss=token would be ignored",
        None,
    ),
    (
        "prune-layer-distill-without-finetune",
        "lm",
        ["experiment=prune", "prune.recover=lsq", "prune.finetune.layer_distill=1.0"],
        "prune.finetune.layer_distill=1.0 would be ignored",
        None,
    ),
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
    ("study-target-flops-zero", "nli", ["experiment=study", "prune.target={{flops:0}}"], "(0, 1)", None),
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
    ("unit-bogus", "lm", ["experiment=prune", "prune.unit=layers"], "prune.unit", None),
    (
        "unit-kv-group-without-gqa",
        "lm",
        ["experiment=prune", "prune.unit=kv_group", "model.config.num_key_value_heads=4"],
        "grouped-query attention",
        None,
    ),
    ("unit-kv-group-encoder", "nli", ["experiment=ablate", "prune.unit=kv_group"], "grouped-query attention", None),
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
    ("lm-min-units-kv-group", "lm", ["experiment=prune", "prune.unit=kv_group", "prune.min_units_per_layer=2"], "at most 1", None),
    # layouts, recovery budgets, LoRA, the control and extra evaluation splits
    ("prune-layout-bogus", "lm", ["experiment=prune", "prune.layout=diagonal"], "prune.layout", None),
    ("prune-control-not-boolean", "lm", ["experiment=prune", "prune.recover=finetune", "prune.control=maybe"], "prune.control", None),
    ("prune-control-without-finetune", "lm", ["experiment=prune", "prune.recover=lsq", "prune.control=true"], "has no finetune", None),
    (
        "prune-finetune-tokens-negative",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.tokens=-5"],
        "prune.finetune.tokens",
        None,
    ),
    (
        "prune-lora-rank-above-projection",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.lora_rank=100000"],
        "larger than the smallest projection",
        None,
    ),
    (
        "prune-lora-alpha-zero",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.lora_rank=2", "prune.finetune.lora_alpha=0"],
        "prune.finetune.lora_alpha",
        None,
    ),
    ("prune-finetune-progress-not-boolean", "lm", ["experiment=prune", "prune.finetune.progress=maybe"], "prune.finetune.progress", None),
    (
        "prune-finetune-checkpoint-every-zero",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.checkpoint_every=0"],
        "prune.finetune.checkpoint_every",
        None,
    ),
    (
        "prune-finetune-checkpoint-every-without-finetune",
        "lm",
        ["experiment=prune", "prune.recover=lsq", "prune.finetune.checkpoint_every=10"],
        "prune.finetune.checkpoint_every=10 would be ignored",
        None,
    ),
    (
        "prune-finetune-teacher-unknown",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.control=true", "prune.finetune.teacher=teacher"],
        "prune.finetune.teacher",
        None,
    ),
    (
        "prune-finetune-teacher-control-without-control",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.teacher=control"],
        "set prune.control=true",
        None,
    ),
    (
        "prune-finetune-teacher-control-with-schedule",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.control=true", "prune.finetune.teacher=control", "prune.schedule=[0.2,0.4]"],
        "prune.finetune.teacher=control is not with prune.schedule",
        None,
    ),
    (
        "prune-finetune-teacher-control-without-distillation",
        "lm",
        [
            "experiment=prune",
            "prune.recover=finetune",
            "prune.control=true",
            "prune.finetune.teacher=control",
            "prune.finetune.distill_weight=0",
        ],
        "prune.finetune.teacher=control would be ignored",
        None,
    ),
    (
        "prune-finetune-teacher-without-finetune",
        "lm",
        ["experiment=prune", "prune.recover=lsq", "prune.finetune.teacher=control"],
        "prune.finetune.teacher=control would be ignored",
        None,
    ),
    (
        "prune-finetune-precision-unknown",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.precision=16-mixed"],
        "prune.finetune.precision",
        None,
    ),
    (
        "prune-finetune-precision-without-finetune",
        "lm",
        ["experiment=prune", "prune.recover=lsq", "prune.finetune.precision=bf16-mixed"],
        "prune.finetune.precision=bf16-mixed would be ignored",
        None,
    ),
    ("prune-extra-splits-repeat-the-split", "lm", ["experiment=prune", "prune.extra_splits=[eval]"], "repeats prune.split", None),
    ("prune-extra-splits-unknown", "lm", ["experiment=prune", "prune.extra_splits=[valid]"], "prune.extra_splits", None),
    (
        "prune-vocab-text-unknown-split",
        "lm",
        ["experiment=prune", "prune.unit=vocab", "prune.vocab_text=[valid]"],
        "prune.vocab_text",
        None,
    ),
    (
        "prune-vocab-text-without-vocab",
        "lm",
        ["experiment=prune", "prune.vocab_text=[train]"],
        "would be ignored: it keeps the tokens of these splits' text, and prune.unit=head removes no tokens",
        None,
    ),
    (
        "prune-vocab-text-no-importance-split",
        "mt",
        ["experiment=prune", "prune.unit=vocab", "prune.vocab_text=[importance]"],
        "unknown split",
        None,
    ),
    ("prune-vocab-text-repeated", "lm", ["experiment=prune", "prune.unit=vocab", "prune.vocab_text=[train,train]"], "more than once", None),
    ("prune-vocab-text-not-a-list", "lm", ["experiment=prune", "prune.unit=vocab", "prune.vocab_text=7"], "prune.vocab_text", None),
    ("speed-runtime-bogus", "lm", ["experiment=speed", "speed.runtime=tensorrt"], "speed.runtime", None),
    # schedules of targets: one kind, each step beyond the one before
    (
        "prune-schedule-shrinking-speedup",
        "nli",
        ["experiment=prune", "prune.schedule=[{{speedup:1.5}},{{speedup:1.2}}]"],
        "already met",
        None,
    ),
    ("prune-schedule-equal-speedup", "mt", ["experiment=prune", "prune.schedule=[{{speedup:1.2}},{{speedup:1.2}}]"], "already met", None),
    ("prune-schedule-growing-flops", "nli", ["experiment=prune", "prune.schedule=[{{flops:0.6}},{{flops:0.8}}]"], "already met", None),
    (
        "prune-schedule-mixed-kinds",
        "nli",
        ["experiment=prune", "prune.schedule=[{{speedup:1.2}},{{flops:0.9}}]"],
        "one kind of target",
        None,
    ),
    ("prune-schedule-fraction-then-target", "nli", ["experiment=prune", "prune.schedule=[0.2,{{speedup:1.2}}]"], "not a mix", None),
    ("prune-schedule-words", "nli", ["experiment=prune", "prune.schedule=[a,b]"], "a schedule step is a fraction", None),
    ("prune-schedule-zero-first", "nli", ["experiment=prune", "prune.schedule=[0,0.2]"], "prunes nothing", None),
    ("prune-target-flops-one", "nli", ["experiment=prune", "prune.target={{flops:1.0}}"], "removes nothing", None),
    ("study-schedule-mixed", "nli", ["experiment=study", "prune.schedule=[0.2,{{speedup:1.2}}]"], "not a mix", None),
    # settings that would be ignored or contradict each other
    ("speed-mask-order-without-file", "nli", ["experiment=speed", "speed.mask_order=fisher+lsq"], "needs speed.mask_file", None),
    ("speed-mask-step-without-file", "nli", ["experiment=speed", "speed.mask_step='speedup=1.3'"], "speed.mask_step", None),
    ("speed-mask-step-not-text", "nli", ["experiment=speed", "speed.mask_step=0.4"], "speed.mask_step must be a non-empty text", None),
    ("speed-point-without-file", "nli", ["experiment=speed", "speed.point=fisher+finetune@40%"], "give speed.mask_file", None),
    ("speed-point-not-text", "nli", ["experiment=speed", "speed.point=0.4"], "speed.point must be a non-empty text", None),
    ("study-speed-point", "nli", ["experiment=study", "speed.point=fisher+finetune@40%"], "speed.point", None),
    ("prune-finetune-warmup-without-decay", "nli", ["experiment=prune", "prune.finetune.warmup=0.1"], "decay=true", None),
    ("speed-repeats-above-max", "nli", ["experiment=speed", "speed.repeats=10", "speed.max_repeats=3"], "speed.max_repeats", None),
    (
        "prune-measure-speed-repeats-above-max",
        "nli",
        ["experiment=prune", "prune.measure_speed=true", "speed.repeats=9", "speed.max_repeats=4"],
        "speed.max_repeats",
        None,
    ),
    ("prune-latency-without-target", "nli", ["experiment=prune", "prune.cost=latency"], "without one", None),
    ("prune-latency-with-fractions", "nli", ["experiment=prune", "prune.cost=latency", "prune.recover=lsq"], "without one", None),
    (
        "prune-reestimate-with-target",
        "nli",
        ["experiment=prune", "prune.reestimate=true", "prune.target={{speedup:1.3}}"],
        "would be ignored",
        None,
    ),
    (
        "prune-reestimate-with-schedule",
        "mt",
        ["experiment=prune", "prune.reestimate=true", "prune.schedule=[0.2,0.4]"],
        "would be ignored",
        None,
    ),
    (
        "prune-reestimate-random-only",
        "nli",
        ["experiment=prune", "prune.reestimate=true", "prune.order=random"],
        "can be re-estimated",
        None,
    ),
    (
        "prune-reestimate-obs_fisher",
        "lm",
        ["experiment=prune", "prune.reestimate=true", "prune.unit=[kv_group,ffn]", "prune.order=obs_fisher"],
        "can be re-estimated: add one of",
        None,
    ),
    (
        "prune-reestimate-ablation-random",
        "nli",
        ["experiment=prune", "prune.reestimate=true", "prune.order=[ablation,random]"],
        "can be re-estimated",
        None,
    ),
    ("study-prune-reestimate", "nli", ["experiment=study", "prune.reestimate=true"], "study.reestimate", None),
    ("study-speed-mask-file", "nli", ["experiment=study", "speed.mask_file={tmp}/mask.json"], "belong to experiment=speed", "mask_half"),
    ("study-speed-mask-order", "nli", ["experiment=study", "speed.mask_order=fisher"], "belong to experiment=speed", None),
    ("speed-fraction-zero", "nli", ["experiment=speed", "speed.fraction=0"], "prunes no head", None),
    ("study-speed-fraction-zero", "mt", ["experiment=study", "speed.fraction=0"], "prunes no head", None),
    ("speed-mask-file-every-head", "nli", ["experiment=speed", "speed.mask_file={tmp}/mask.json"], "removes every head", "mask_none_kept"),
    ("speed-mask-file-no-head", "nli", ["experiment=speed", "speed.mask_file={tmp}/mask.json"], "removes no head", "mask_all_kept"),
    (
        "speed-prune-results-fraction-zero",
        "nli",
        ["experiment=speed", "speed.mask_file={tmp}/prune.json", "speed.fraction=0"],
        "removes no head",
        "prune_results",
    ),
    (
        "speed-prune-results-no-order",
        "nli",
        ["experiment=speed", "speed.mask_file={tmp}/prune.json", "speed.mask_order=entropy", "speed.fraction=0.25"],
        "has no order 'entropy'",
        "prune_results",
    ),
    (
        "speed-prune-results-no-step",
        "nli",
        ["experiment=speed", "speed.mask_file={tmp}/prune.json", "speed.fraction=0.5"],
        "no step at fraction 0.5",
        "prune_results",
    ),
    # booleans are booleans
    (
        "prune-finetune-decay-maybe",
        "nli",
        ["experiment=prune", "prune.finetune.decay=maybe"],
        "prune.finetune.decay must be true or false",
        None,
    ),
    (
        "importance-normalize-layers-maybe",
        "nli",
        ["experiment=prune", "importance.normalize_layers=maybe"],
        "importance.normalize_layers",
        None,
    ),
    ("importance-normalize-global-one", "mt", ["experiment=speed", "importance.normalize_global=1"], "must be true or false", None),
    ("prune-reestimate-maybe", "nli", ["experiment=prune", "prune.reestimate=maybe"], "prune.reestimate must be true or false", None),
    ("prune-measure-speed-maybe", "nli", ["experiment=prune", "prune.measure_speed=maybe"], "prune.measure_speed", None),
    ("prune-rearrange-number", "nli", ["experiment=prune", "prune.rearrange=2"], "false, true or both", None),
    ("speed-check-score-maybe", "nli", ["experiment=speed", "speed.check_score=maybe"], "speed.check_score", None),
    ("study-train-maybe", "nli", ["experiment=study", "study.train=maybe"], "study.train must be true or false", None),
    ("study-train-lm", "lm", ["experiment=study"], "the lm task has no trainer: set study.train=false", None),
    ("study-reestimate-text", "mt", ["experiment=study", "study.reestimate=yes"], "study.reestimate", None),
    ("nli-importance-holdout-maybe", "nli", ["experiment=ablate", "data.importance_holdout=maybe"], "data.importance_holdout", None),
    ("nli-group-by-length-maybe", "nli", ["experiment=nli_finetune", "data.group_by_length=maybe"], "data.group_by_length", None),
    ("nli-exact-eval-maybe", "nli", ["experiment=nli_finetune", "task.exact_eval=maybe"], "task.exact_eval", None),
    ("lm-add-bos-maybe", "lm", ["experiment=prune", "data.add_bos=maybe"], "data.add_bos must be true or false", None),
    (
        "mt-trust-remote-code-maybe",
        "mt",
        ["experiment=ablate", "data=mt_hub", "data.hub.trust_remote_code=maybe"],
        "trust_remote_code",
        None,
    ),
    (
        "trainer-progress-bar-maybe",
        "nli",
        ["experiment=nli_finetune", "trainer.enable_progress_bar=maybe"],
        "trainer.enable_progress_bar",
        None,
    ),
    (
        "trainer-deterministic-maybe",
        "mt",
        ["experiment=mt_train", "model=tiny_marian", "trainer.deterministic=maybe"],
        "false, true or warn",
        None,
    ),
    # other types and ranges of the schema
    ("prune-lsq-ridge-zero", "nli", ["experiment=prune", "prune.lsq.ridge=0"], "prune.lsq.ridge", None),
    ("prune-seq-len-zero", "nli", ["experiment=prune", "prune.seq_len=0"], "prune.seq_len", None),
    ("checkpoint-top-k", "nli", ["experiment=nli_finetune", "callbacks.checkpoint.save_top_k=-2"], "save_top_k", None),
    ("inspect-seq-len-zero", "nli", ["experiment=inspect", "inspect.seq_len=0"], "inspect.seq_len", None),
    (
        "dynamics-report-fraction",
        "mt",
        ["experiment=dynamics", "ckpt_dir=x", "dynamics.report_fraction=2"],
        "dynamics.report_fraction",
        None,
    ),
    ("mt-beam-size-zero", "mt", ["experiment=ablate", "task.beam_size=0"], "task.beam_size", None),
    ("nli-lr-negative", "nli", ["experiment=nli_finetune", "task.lr=-1"], "task.lr", None),
    ("lm-limit-zero", "lm", ["experiment=ablate", "data.limits.eval=0"], "data.limits.eval", None),
    # lengths past the model (tiny models take 128 positions)
    ("lm-decode-past-positions", "lm", ["experiment=speed", "task.decode_tokens=300"], "at most 128 positions", None),
    ("lm-decode-a-billion", "lm", ["experiment=speed", "task.decode_tokens=1000000000"], "lower task.decode_tokens", None),
    ("lm-prompt-plus-decode", "lm", ["experiment=speed", "task.decode_tokens=120", "task.decode_prompt_tokens=16"], "136 tokens", None),
    ("lm-max-length-past-positions", "lm", ["experiment=prune", "data.max_length=512"], "data.max_length=512", None),
    ("nli-max-length-past-positions", "nli", ["experiment=ablate", "data.max_length=512"], "data.max_length=512", None),
    ("mt-max-len-past-positions", "mt", ["experiment=mt_train", "model=tiny_marian", "data.max_len=256"], "data.max_len=256", None),
    # unclear errors made clear
    ("prune-order-empty", "nli", ["experiment=prune", "prune.order=[]"], "prune.order is empty", None),
    ("study-order-empty", "mt", ["experiment=study", "prune.order=[]"], "prune.order is empty", None),
    ("nli-importance-size-zero", "nli", ["experiment=prune", "data.importance_size=0"], "data.importance_size=0", None),
    ("nli-keep-one-importance-size-zero", "nli", ["experiment=keep_one", "data.importance_size=0"], "data.importance_size", None),
    ("mt-importance-size-zero", "mt", ["experiment=prune", "data.importance.size=0"], "data.importance.size", None),
    ("lm-importance-file-empty", "lm", ["experiment=prune", *LM_FILES], "data.files.importance=['importance.txt']", "lm_empty"),
    ("lm-utf8", "lm", ["experiment=ablate", *LM_FILES], "heldout.txt:3: not valid UTF-8", "lm_utf8"),
    # data.json_fields: the text fields of JSON-lines files
    ("lm-json-fields-unset", "lm", ["experiment=ablate", *LM_JSON_FILES], "set data.json_fields", "lm_json"),
    (
        "lm-json-fields-twice",
        "lm",
        ["experiment=ablate", *LM_JSON_FILES, "data.json_fields=[premise,premise]"],
        "names 'premise' more than once",
        "lm_json",
    ),
    ("lm-json-fields-empty", "lm", ["experiment=ablate", *LM_FILES, "data.json_fields=[]"], "data.json_fields is empty", "lm_json"),
    ("lm-json-fields-unread", "lm", ["experiment=ablate", *LM_FILES, "data.json_fields=[premise]"], "it would be ignored", "lm_json"),
    (
        "lm-json-row-malformed",
        "lm",
        ["experiment=ablate", *LM_JSON_FILES, "data.json_fields=[premise]"],
        "train.jsonl:3: not a JSON object",
        "lm_json_bad",
    ),
    (
        "lm-json-row-without-field",
        "lm",
        ["experiment=ablate", *LM_JSON_FILES, "data.json_fields=[premise]"],
        "train.jsonl:2: no text field ['premise']",
        "lm_json_field",
    ),
    (
        "pretrained-is-config-json",
        "nli",
        ["experiment=ablate", "model=minilm", "model.pretrained={models}/complete/config.json"],
        "is a file",
        None,
    ),
    ("tokenizer-is-a-file", "nli", ["experiment=ablate", "model.tokenizer={models}/complete/config.json"], "model.tokenizer", None),
    ("device-cuda-without-gpu", "nli", ["experiment=prune", "device=cuda"], "no GPU here", None),
    ("device-cuda-index-without-gpu", "lm", ["experiment=speed", "device=cuda:1"], "no GPU here", None),
    ("device-bogus", "nli", ["experiment=ablate", "device=tpu9"], "is no device", None),
    ("trainer-gpu-without-gpu", "nli", ["experiment=nli_finetune", "trainer=gpu"], "no GPU here", None),
    ("mt-train-gpu-without-gpu", "mt", ["experiment=mt_train", "model=tiny_marian", "trainer=gpu"], "trainer=cpu", None),
    ("study-train-gpu-without-gpu", "nli", ["experiment=study", "trainer=gpu"], "no GPU here", None),
    # lists name each item once
    ("prune-recover-repeated", "nli", ["experiment=prune", "prune.recover=[none,none]"], "names 'none' more than once", None),
    ("prune-order-repeated", "nli", ["experiment=prune", "prune.order=[fisher,fisher]"], "names 'fisher' more than once", None),
    ("prune-fractions-repeated", "nli", ["experiment=prune", "prune.fractions=[0.5,0.5]"], "prune.fractions=[0.5, 0.5] names", None),
    ("prune-groups-repeated", "mt", ["experiment=prune", "prune.groups=[enc_self,enc_self]"], "prune.groups", None),
    ("prune-extra-splits-repeated", "lm", ["experiment=prune", "prune.extra_splits=[heldout,heldout]"], "more than once", None),
    ("ablate-splits-repeated", "nli", ["experiment=ablate", "ablate.splits=[eval,eval]"], "ablate.splits", None),
    ("keep-one-groups-repeated", "mt", ["experiment=keep_one", "keep_one.groups=[enc_self,enc_self]"], "keep_one.groups", None),
    ("speed-batch-sizes-repeated", "nli", ["experiment=speed", "speed.batch_sizes=[4,4]"], "names 4 more than once", None),
    (
        "study-extra-splits-repeated",
        "nli",
        ["experiment=study", "study.extra_splits=[eval_mismatched,eval_mismatched]"],
        "more than once",
        None,
    ),
    (
        "dynamics-fractions-repeated",
        "mt",
        ["experiment=dynamics", "ckpt_dir={tmp}", "dynamics.fractions=[0.1,0.1]"],
        "more than once",
        None,
    ),
    # a setting the run does not read (the general rule), and settings read only when another says so
    ("ablate-prune-order-unread", "nli", ["experiment=ablate", "prune.order=fisher"], "not read by experiment=ablate", None),
    ("speed-prune-fractions-unread", "nli", ["experiment=speed", "prune.fractions=[0.5]"], "not read by experiment=speed", None),
    ("export-prune-layout-unread", "nli", ["experiment=export", "prune.layout=uniform"], "not read by experiment=export", None),
    ("ablate-trainer-unread", "nli", ["experiment=ablate", "trainer.max_epochs=5"], "trainer.max_epochs=5 is not read", None),
    ("keep-one-callbacks-unread", "nli", ["experiment=keep_one", "callbacks=head_dynamics"], "not read by experiment=keep_one", None),
    ("prune-speed-without-measure-speed", "nli", ["experiment=prune", "speed.repeats=3"], "prune.measure_speed=true only", None),
    (
        "speed-importance-with-mask-file",
        "nli",
        ["experiment=speed", "speed.mask_file={tmp}/prune.json", "speed.fraction=0.25", "importance.reduce=token"],
        "the mask comes from the file",
        "prune_results",
    ),
    ("prune-finetune-trainer-gpu", "nli", ["experiment=prune", "prune.recover=finetune", "trainer=gpu"], "model's device", None),
    (
        "prune-step-with-fractions",
        "nli",
        ["experiment=prune", "prune.step=0.2", "prune.fractions=[0.5]"],
        "prune.step=0.2 would be ignored",
        None,
    ),
    (
        "prune-max-fraction-with-fractions",
        "nli",
        ["experiment=prune", "prune.max_fraction=0.5", "prune.fractions=[0.5]"],
        "lists the fractions",
        None,
    ),
    (
        "prune-lora-rank-without-finetune",
        "lm",
        ["experiment=prune", "prune.finetune.lora_rank=4"],
        "prune.finetune.lora_rank=4 would be ignored",
        None,
    ),
    ("prune-tokens-without-finetune", "lm", ["experiment=prune", "prune.recover=lsq", "prune.finetune.tokens=100"], "runs none", None),
    (
        "prune-max-steps-with-tokens",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.tokens=200", "prune.finetune.max_steps=5"],
        "one pass over the budget",
        None,
    ),
    (
        "prune-lora-alpha-without-rank",
        "lm",
        ["experiment=prune", "prune.recover=finetune", "prune.finetune.lora_alpha=8"],
        "needs prune.finetune.lora_rank",
        None,
    ),
    ("prune-lsq-without-lsq", "nli", ["experiment=prune", "prune.lsq.ridge=0.5"], "prune.lsq.ridge=0.5 would be ignored", None),
    (
        "prune-reconstruct-without-reconstruct",
        "nli",
        ["experiment=prune", "prune.reconstruct.ridge=0.5"],
        "prune.reconstruct.ridge=0.5 would be ignored",
        None,
    ),
    (
        "prune-reconstruct-ridge-zero",
        "nli",
        ["experiment=prune", "prune.recover=reconstruct", "prune.reconstruct.ridge=0"],
        "prune.reconstruct.ridge",
        None,
    ),
    (
        "prune-lsq-with-hidden-in-a-list",
        "lm",
        ["experiment=prune", "prune.unit=[ffn,hidden]", "prune.recover=lsq", "prune.fractions=[0.25]"],
        "hidden: least-squares recovery rescales heads and neurons",
        None,
    ),
    (
        "prune-reconstruct-target-inputs-hidden",
        "lm",
        [
            "experiment=prune",
            "prune.unit=[ffn,hidden]",
            "prune.recover=reconstruct",
            "prune.reconstruct.target=inputs",
            "prune.fractions=[0.25]",
        ],
        "prune.reconstruct.target=inputs replays",
        None,
    ),
    (
        "prune-recover-chain-out-of-order",
        "nli",
        ["experiment=prune", "prune.recover=finetune+reconstruct"],
        "write 'reconstruct+finetune'",
        None,
    ),
    ("prune-recover-chain-repeat", "nli", ["experiment=prune", "prune.recover=lsq+lsq"], "runs a step twice", None),
    ("prune-recover-chain-none", "nli", ["experiment=prune", "prune.recover=none+finetune"], "chains none", None),
    ("prune-recover-chain-unknown", "nli", ["experiment=prune", "prune.recover=reconstruct+tune"], "must be one of", None),
    (
        "prune-recover-chain-twice-in-list",
        "nli",
        ["experiment=prune", "prune.recover=[reconstruct+finetune,reconstruct+finetune]"],
        "prune.recover",
        None,
    ),
    (
        "prune-obs-tokens-without-obs",
        "nli",
        ["experiment=prune", "prune.order=fisher", "prune.obs_tokens=gradient"],
        "prune.obs_tokens=gradient would be ignored",
        None,
    ),
    (
        "prune-obs-tokens-unknown",
        "nli",
        ["experiment=prune", "prune.order=obs", "prune.obs_tokens=all"],
        "prune.obs_tokens",
        None,
    ),
    (
        "prune-reconstruct-tokens-unknown",
        "nli",
        ["experiment=prune", "prune.recover=reconstruct", "prune.reconstruct.tokens=loss"],
        "prune.reconstruct.tokens",
        None,
    ),
    (
        "prune-reconstruct-tokens-without-reconstruct",
        "nli",
        ["experiment=prune", "prune.recover=lsq", "prune.reconstruct.tokens=gradient"],
        "prune.reconstruct.tokens=gradient would be ignored",
        None,
    ),
    (
        "prune-reconstruct-target-unknown",
        "lm",
        ["experiment=prune", "prune.recover=reconstruct", "prune.reconstruct.target=own"],
        "prune.reconstruct.target",
        None,
    ),
    (
        "prune-obs-stream",
        "lm",
        ["experiment=prune", "prune.unit=kv_group", "prune.action=stream", "prune.order=obs"],
        "the obs order prices removing a unit",
        None,
    ),
    (
        "prune-obs_fisher-stream",
        "lm",
        ["experiment=prune", "prune.unit=kv_group", "prune.action=stream", "prune.order=obs_fisher"],
        "the obs order prices removing a unit",
        None,
    ),
    (
        "prune-obs_fisher-vocab",
        "lm",
        ["experiment=prune", "prune.unit=[ffn,vocab]", "prune.order=obs_fisher", "prune.fractions=[0.25]"],
        "vocab units have none",
        None,
    ),
    (
        "prune-obs-bias-without-obs",
        "nli",
        ["experiment=prune", "prune.obs_bias=false"],
        "prune.obs_bias=False would be ignored: it says how the obs orders price a unit",
        None,
    ),
    ("prune-obs-bias-not-a-boolean", "nli", ["experiment=prune", "prune.order=obs", "prune.obs_bias=sometimes"], "prune.obs_bias", None),
    (
        "prune-obs-vocab",
        "lm",
        ["experiment=prune", "prune.unit=vocab", "prune.order=obs", "prune.fractions=[0.25]"],
        "vocab units have none",
        None,
    ),
    (
        "prune-reconstruct-stream",
        "lm",
        ["experiment=prune", "prune.unit=kv_group", "prune.action=stream", "prune.recover=reconstruct"],
        "prune.action=stream",
        None,
    ),
    ("prune-recover-examples-without-recovery", "nli", ["experiment=prune", "prune.recover_examples=16"], "prune.recover=none", None),
    ("prune-selection-split-without-max-drop", "nli", ["experiment=prune", "prune.selection_split=importance"], "max_drop", None),
    ("prune-seq-len-plain-curves", "nli", ["experiment=prune", "prune.seq_len=64"], "cost model", None),
    ("prune-latency-batch-without-latency", "nli", ["experiment=prune", "prune.latency_batch_size=4"], "prune.cost=latency", None),
    ("prune-n-samples-without-ablation", "nli", ["experiment=prune", "prune.n_samples=50"], "ablation order", None),
    ("export-mask-order-with-model", "nli", ["experiment=export", "export.model={tmp}", "export.mask_order=fisher"], "as it is", None),
    ("export-fraction-with-model", "nli", ["experiment=export", "export.model={tmp}", "export.fraction=0.25"], "as it is", None),
    ("export-mask-step-with-model", "nli", ["experiment=export", "export.model={tmp}", "export.mask_step='speedup=1.3'"], "as it is", None),
    (
        "export-gguf-dtype-with-onnx",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/prune.json", "export.gguf_dtype=f16"],
        "shape GGUF files",
        "prune_results",
    ),
    (
        "export-per-channel-without-int8",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/prune.json", "export.per_channel=false"],
        "export.quantize=int8 only",
        "prune_results",
    ),
    (
        "export-client-check-without-client",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/prune.json", "export.client_check=false"],
        "export.client_check=False would be ignored: it runs deci_hf and gguf exports in their client, and export.format=onnx",
        "prune_results",
    ),
    (
        "export-client-check-not-boolean",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/prune.json", "export.client_check=maybe"],
        "export.client_check",
        "prune_results",
    ),
    ("nli-finetune-resume-nothing", "nli", ["experiment=nli_finetune", "ckpt_path=last"], "nothing to resume", None),
    (
        "mt-train-resume-missing-file",
        "mt",
        ["experiment=mt_train", "model=tiny_marian", "ckpt_path={tmp}/no.ckpt"],
        "nothing to resume",
        None,
    ),
    (
        "prune-measure-speed-fraction-unread",
        "nli",
        ["experiment=prune", "prune.measure_speed=true", "speed.fraction=0.3"],
        "speed.fraction=0.3 is not read by experiment=prune",
        None,
    ),
    (
        "prune-measure-speed-onnxruntime-unread",
        "nli",
        ["experiment=prune", "prune.measure_speed=true", "speed.runtime=onnxruntime"],
        "not read by experiment=prune",
        None,
    ),
    ("prune-key-misspelt", "nli", ["experiment=prune", "+prune.fractoins=[0.5]"], "is no setting of prune.*", None),
    (
        "ablate-trainer-argument-unread",
        "nli",
        ["experiment=ablate", "+trainer.max_time=00:01:00:00"],
        "not read by experiment=ablate",
        None,
    ),
    (
        "export-per-channel-maybe",
        "nli",
        ["experiment=export", "export.per_channel=maybe"],
        "export.per_channel must be true or false",
        None,
    ),
    ("export-examples-zero", "nli", ["experiment=export", "export.examples=0"], "export.examples must be >= 1", None),
    (
        "nli-finetune-model-summary-maybe",
        "nli",
        ["experiment=nli_finetune", "+trainer.enable_model_summary=maybe"],
        "trainer.enable_model_summary must be true or false",
        None,
    ),
    (
        "study-train-overrides-bad-trainer",
        "nli",
        ["experiment=study", "++study.train_overrides={{trainer.max_steps:-5}}"],
        "trainer.max_steps must be >= -1",
        None,
    ),
    # unclear errors made clear
    ("mt-len-extra-past-positions", "mt", ["experiment=ablate", "task.len_extra=100000"], "task.len_extra=100000", None),
    (
        "mt-ckpt-truncated",
        "mt",
        ["experiment=ablate", "model.pretrained={tmp}/last.ckpt"],
        "last.ckpt is no readable checkpoint",
        "ckpt_truncated",
    ),
    ("lm-extra-splits-not-in-data", "lm", ["experiment=prune", "prune.extra_splits=[eval_other]"], "is not in data lm_synthetic", None),
    (
        "model-attn-implementation-bogus",
        "nli",
        ["experiment=ablate", "model.attn_implementation=banana"],
        "no attention implementation",
        None,
    ),
    ("report-run-dir-missing", "nli", ["experiment=report", "run_dir={tmp}/nothing"], "run_dir=", None),
    ("dynamics-ckpt-dir-missing", "mt", ["experiment=dynamics", "ckpt_dir={tmp}/nothing"], "is not a directory", None),
    # mask files and run directories are inputs: what is wrong with them and what they hold, never "delete it"
    ("export-mask-file-empty", "nli", ["experiment=export", "export.mask_file={tmp}/mask.json"], "is empty (an interrupted", "mask_empty"),
    (
        "export-mask-file-garbage",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/mask.json"],
        "no mask can be read from it; a mask file is the results.json of a prune run (or of a study",
        "mask_garbage",
    ),
    ("speed-mask-file-truncated", "nli", ["experiment=speed", "speed.mask_file={tmp}/mask.json"], '{"mask": {group:', "mask_truncated"),
    (
        "export-mask-file-bare-mask",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/mask.json"],
        'without its wrapper: a mask JSON puts it under "mask"',
        "mask_bare",
    ),
    ("speed-mask-file-bare-mask", "lm", ["experiment=speed", "speed.mask_file={tmp}/mask.json"], "without its wrapper", "mask_bare"),
    (
        "speed-mask-file-a-list",
        "nli",
        ["experiment=speed", "speed.mask_file={tmp}/mask.json"],
        "holds a JSON list, not an object",
        "mask_list",
    ),
    (
        "export-mask-file-ablate-results",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/mask.json"],
        "holds no mask (it is the results.json of experiment=ablate)",
        "ablate_results",
    ),
    (
        "speed-mask-file-a-directory",
        "nli",
        ["experiment=speed", "speed.mask_file={tmp}/prior"],
        "is a directory (did you mean",
        "prior_run",
    ),
    ("report-results-damaged", "nli", ["experiment=report", "run_dir={tmp}/prior"], "the report only reads it", "run_damaged"),
    ("report-results-a-list", "nli", ["experiment=report", "run_dir={tmp}/prior"], "holds a JSON list", "run_list"),
    # groups the model does not have, lengths past its positions
    ("prune-groups-not-in-encoder", "nli", ["experiment=prune", "prune.groups=[dec_self]"], "has the head groups ['enc_self']", None),
    (
        "ablate-groups-not-in-decoder",
        "lm",
        ["experiment=ablate", "ablate.groups=[enc_self]"],
        "has the head groups ['dec_self']",
        None,
    ),
    ("keep-one-groups-not-in-encoder", "nli", ["experiment=keep_one", "keep_one.groups=[enc_dec]"], "names ['enc_dec']", None),
    ("study-groups-not-in-decoder", "lm", ["experiment=study", "prune.groups=[enc_dec]"], "prune.groups=['enc_dec']", None),
    ("prune-groups-unknown-name", "mt", ["experiment=prune", "prune.groups=[decoder]"], "['enc_self', 'enc_dec', 'dec_self']", None),
    (
        "prune-latency-seq-len-past-positions",
        "nli",
        ["experiment=prune", "prune.target={{speedup:1.3}}", "prune.cost=latency", "prune.seq_len=100000"],
        "set prune.seq_len<=128",
        None,
    ),
    (
        "study-latency-seq-len-past-positions",
        "lm",
        ["experiment=study", "prune.target={{speedup:1.3}}", "prune.cost=latency", "prune.seq_len=129"],
        "takes at most 128 positions",
        None,
    ),
    # image folders: their classes are the model's
    (
        "image-folder-one-class",
        "vision",
        ["experiment=vit_finetune", "data.source=folder", "data.dir={tmp}/images", "data.eval_size=4", "data.importance_size=2"],
        "a classifier needs two classes or more",
        "images_one_class",
    ),
    (
        "image-folder-class-too-few-images",
        "vision",
        ["experiment=vit_finetune", "data.source=folder", "data.dir={tmp}/images", "data.eval_size=6", "data.importance_size=4"],
        "class 'owl' (data.dir=",
        "images_one_rare",
    ),
    (
        "image-folder-fewer-images-than-splits",
        "vision",
        ["experiment=ablate", "data.source=folder", "data.dir={tmp}/images"],
        "25 images cannot give data.eval_size=60",
        "images_one_rare",
    ),
    ("image-model-of-other-classes", "vision", ["experiment=ablate", "model.pretrained={tmp}/vit3"], "classifies 3 classes", "vit_saved"),
    # hub datasets without network or cache: one line before any download
    (
        "image-hub-offline",
        "vision",
        ["experiment=vit_finetune", "data=image_hub", "data.hub_path=headprune-tests/no-such-images"],
        "the hub cannot be reached",
        None,
    ),
    (
        "lm-hub-offline",
        "lm",
        ["experiment=ablate", "data=lm_hub", "data.hub_path=headprune-tests/no-such-texts", "data.max_length=64"],
        "the hub cannot be reached",
        None,
    ),
    (
        "nli-hub-offline",
        "nli",
        ["experiment=ablate", "data=nli_hub", "data.hub_path=headprune-tests/no-such-pairs"],
        "not in the datasets cache",
        None,
    ),
    ("mt-hub-offline", "mt", ["experiment=ablate", "data=mt_hub", "data.hub.path=headprune-tests/no-such-pairs"], "data.hub.path=", None),
    # synthetic sets of no examples
    ("nli-synthetic-train-zero", "nli", ["experiment=nli_finetune", "data.synthetic.train_size=0"], "data.synthetic.train_size", None),
    ("nli-synthetic-eval-zero", "nli", ["experiment=ablate", "data.synthetic.eval_size=0"], "data.synthetic.eval_size", None),
    (
        "nli-synthetic-train-below-importance",
        "nli",
        ["experiment=prune", "data.synthetic.train_size=50"],
        "data.importance_size=40 is more than the 25 examples",
        None,
    ),
    (
        "mt-synthetic-train-zero",
        "mt",
        ["experiment=mt_train", "model=tiny_marian", "data.synthetic.sizes.train=0"],
        "data.synthetic.sizes.train",
        None,
    ),
    (
        "lm-synthetic-importance-zero",
        "lm",
        ["experiment=ablate", "data.synthetic.sizes.importance=0"],
        "data.synthetic.sizes.importance",
        None,
    ),
    # attention implementations and model types headprune cannot run
    (
        "flash-attention-without-package",
        "nli",
        ["experiment=ablate", "model.attn_implementation=flash_attention_2"],
        "model.attn_implementation=flash_attention_2",
        None,
    ),
    ("model-type-unknown-config", "nli", ["experiment=ablate", "model.config.model_type=foobar"], "model_type='foobar'", None),
    ("model-type-mamba-inspect", "lm", ["experiment=inspect", "model.config.model_type=mamba"], "model_type='mamba'", None),
    (
        "model-type-unknown-model-dir",
        "nli",
        ["experiment=ablate", "model=minilm", "model.pretrained={tmp}/foobar"],
        "foobar/config.json says model_type='foobar'",
        "foobar_dir",
    ),
    # advice names the setting that gave the data directory
    (
        "lm-data-dir-missing-files",
        "lm",
        ["experiment=ablate", "data=lm_local", "data.dir={tmp}/nothing", "data.max_length=64"],
        "point data.dir at the directory with wmt/en-de/newstest2014.en",
        None,
    ),
    (
        "mt-data-dir-missing-files",
        "mt",
        ["experiment=ablate", "data=mt_multi30k", "data.dir={tmp}/nothing"],
        "point data.dir at the directory with train.en and train.de",
        None,
    ),
    ("nli-data-dir-missing-files", "nli", ["experiment=ablate", "data=nli_local", "data.dir={tmp}/nothing"], "point data.dir at", None),
    ("lm-paths-data-dir-missing-files", "lm", ["experiment=ablate", "data=lm_local", "data.max_length=64"], "under paths.data_dir", None),
    # dynamics: every checkpoint checked before the first is analysed
    (
        "dynamics-steps-named-in-part",
        "lm",
        ["experiment=dynamics", "checkpoints=[{tmp}/run/step100,{tmp}/run/final]"],
        "name no step",
        None,
    ),
    (
        "dynamics-steps-repeated",
        "lm",
        ["experiment=dynamics", "checkpoints=[{tmp}/a/step100,{tmp}/b/checkpoint-100]"],
        "all tell step 100",
        None,
    ),
    (
        "dynamics-llama-beside-bert",
        "nli",
        ["experiment=dynamics", "checkpoints=[{models}/complete,{tmp}/llama]"],
        "is not the same model as",
        "llama_dir",
    ),
    (
        "dynamics-truncated-weights-second",
        "nli",
        ["experiment=dynamics", "checkpoints=[{models}/complete,{tmp}/bert]"],
        "model.safetensors cannot be read as weights",
        "bert_truncated",
    ),
    (
        "dynamics-ckpt-truncated-second",
        "mt",
        ["experiment=dynamics", "ckpt_dir={tmp}/run/checkpoints"],
        "epoch001-step20.ckpt is no readable checkpoint",
        "epochs_truncated",
    ),
    ("dynamics-ckpt-dir-without-epochs", "mt", ["experiment=dynamics", "ckpt_dir={tmp}"], "no per-epoch checkpoints", None),
    # inspect counts an image model at its own tokens
    ("inspect-seq-len-image-model", "vision", ["experiment=inspect", "inspect.seq_len=64"], "inspect.seq_len=64 would be ignored", None),
    # units beyond heads: kinds, joint lists and the orders and layouts they allow
    ("unit-joint-unknown-kind", "lm", ["experiment=prune", "prune.unit=[kv_group,mlp]"], "unknown pruning unit", None),
    ("unit-joint-kind-twice", "lm", ["experiment=prune", "prune.unit=[ffn,ffn]"], "names a kind twice", None),
    ("unit-joint-same-part", "lm", ["experiment=prune", "prune.unit=[head,kv_group]"], "both prune the attention part", None),
    ("unit-block-uniform", "nli", ["experiment=prune", "prune.unit=block", "prune.layout=uniform"], "prune.layout=global", None),
    ("unit-hidden-marian", "mt", ["experiment=prune", "prune.unit=hidden"], "Marian's sinusoidal positions", None),
    ("unit-vocab-image-model", "vision", ["experiment=prune", "prune.unit=[ffn,vocab]"], "read no token ids", None),
    ("unit-hidden-deberta", "nli", ["experiment=prune", "model=tiny_deberta_v2", "prune.unit=[head,hidden]"], "relative-position", None),
    ("unit-layer-uniform", "lm", ["experiment=prune", "prune.unit=layer", "prune.layout=uniform"], "prune.layout=global", None),
    (
        "unit-ffn-attention-group",
        "lm",
        ["experiment=prune", "prune.unit=ffn", "prune.groups=[dec_self]"],
        "the ffn groups ['dec_ffn']",
        None,
    ),
    ("unit-block-ffn-group", "lm", ["experiment=prune", "prune.unit=block", "prune.groups=[dec_ffn]"], "dec_ffn_block", None),
    (
        "unit-ffn-floor-above-width",
        "lm",
        ["experiment=prune", "prune.unit=ffn", "prune.min_units_per_layer=100"],
        "keeps every neuron",
        None,
    ),
    (
        "unit-kv-floor-names-kv",
        "lm",
        ["experiment=prune", "prune.unit=kv_group", "prune.min_units_per_layer=2"],
        "keeps every KV group",
        None,
    ),
    (
        "ffn-multiple-above-width",
        "lm",
        ["experiment=prune", "prune.unit=ffn", "prune.ffn_multiple=128"],
        "must divide the FFN width 64",
        None,
    ),
    (
        "ffn-multiple-not-dividing",
        "lm",
        ["experiment=prune", "prune.unit=ffn", "prune.ffn_multiple=48"],
        "must divide the FFN width 64",
        None,
    ),
    ("unit-ffn-ablation-order", "nli", ["experiment=prune", "prune.unit=ffn", "prune.order=ablation"], "one FFN neuron at a time", None),
    ("unit-joint-ablate", "nli", ["experiment=ablate", "prune.unit=[head,ffn]"], "one FFN neuron at a time", None),
    ("unit-ffn-keep-one", "nli", ["experiment=keep_one", "prune.unit=ffn"], "one FFN neuron at a time", None),
    ("unit-ffn-entropy-order", "lm", ["experiment=prune", "prune.unit=[kv_group,ffn]", "prune.order=entropy"], "attention entropy", None),
    ("unit-block-min-per-layer", "nli", ["experiment=prune", "prune.unit=block", "prune.min_units_per_layer=1"], "at most 0", None),
    (
        "unit-block-rearrange",
        "nli",
        ["experiment=prune", "prune.unit=block", "prune.order=fisher", "prune.rearrange=true"],
        "with one unit there is nothing to re-choose",
        None,
    ),
    (
        "unit-joint-scale-loss-normalised-importance",
        "lm",
        ["experiment=prune", "prune.unit=[kv_group,ffn]", "prune.joint_scale=loss"],
        "importance.normalize_layers=true rescales the importance scores",
        None,
    ),
    (
        "unit-joint-scale-loss-random",
        "nli",
        ["experiment=prune", "prune.unit=[head,ffn]", "prune.order=random", "prune.joint_scale=loss"],
        "prune.order=random draws scores that estimate nothing",
        None,
    ),
    (
        "unit-joint-scale-loss-speed-mask-order",
        "nli",
        ["experiment=speed", "prune.unit=[head,ffn]", "prune.joint_scale=loss", "speed.mask_order=random"],
        "use prune.joint_scale=relative",
        None,
    ),
    ("unit-joint-scale-one-kind", "nli", ["experiment=prune", "prune.unit=ffn", "prune.joint_scale=loss"], "has one kind", None),
    (
        "unit-joint-scale-speed-mask-file",
        "nli",
        ["experiment=speed", "speed.mask_file={tmp}/mask.json", "prune.unit=[head,ffn]", "prune.joint_scale=loss"],
        "prune.joint_scale=loss would be ignored",
        "mask_half",
    ),
    # points named before the run makes them, and points a run kept no model of
    (
        "prune-save-point-the-run-does-not-make",
        "nli",
        ["experiment=prune", "prune.fractions=[0.5]", "prune.recover=[none,lsq]", "prune.save=[fisher+lsq@40%]"],
        "fisher+lsq@40%, which this run does not make: its settings make importance@50%, importance+lsq@50%",
        None,
    ),
    (
        "prune-save-point-at-another-step",
        "nli",
        ["experiment=prune", "prune.fractions=[0.5]", "prune.recover=lsq", "prune.save=[importance+lsq@40%]"],
        "its settings make importance+lsq@50%",
        None,
    ),
    (
        "export-point-without-saved-model",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/pareto.json", "export.point=importance@25%"],
        "has no saved model",
        "pareto_results",
    ),
    (
        "export-point-without-saved-model-says-how",
        "nli",
        ["experiment=export", "export.mask_file={tmp}/pareto.json", "export.point=importance@25%"],
        "export.mask_order=importance export.mask_step=25% (in place of export.point)",
        "pareto_results",
    ),
    (
        "export-gguf-tokenizer-trained-unnamed",
        "lm",
        ["experiment=export", "export.format=gguf", "export.mask_file={tmp}/mask.json"],
        "trained by the task, so llama.cpp has no name for it): set export.tokenizer_pre=",
        "mask_kv_ok",
    ),
    (
        "export-gguf-tokenizer-unknown-to-llama-cpp",
        "lm",
        ["experiment=export", "export.format=gguf", "export.mask_file={tmp}/mask.json", "model.tokenizer={tmp}/tok"],
        "is not in llama.cpp's converter's table): set export.tokenizer_pre=",
        "mask_kv_ok_tokenizer",
    ),
    (
        "export-gguf-tokenizer-pre-unknown-name",
        "lm",
        ["experiment=export", "export.format=gguf", "export.mask_file={tmp}/mask.json", "export.tokenizer_pre=llama_bpe"],
        "did you mean llama-bpe",
        "mask_kv_ok",
    ),
    (
        "export-gguf-gpt2-query-heads-pruned",
        "lm",
        ["experiment=export", "model=tiny_gpt2", "export.format=gguf", "export.mask_file={tmp}/mask.json"],
        "export.format=gguf writes gpt2 as llama.cpp's gpt2, whose graph reads q, k and v as blocks of the hidden size, and the "
        "mask prunes query heads in layers [0]: prune FFN neurons or layers only (no heads), or use export.format=onnx",
        "mask_dec_heads",
    ),
    (
        "export-gguf-pythia-query-heads-pruned",
        "lm",
        ["experiment=export", "model=tiny_pythia", "export.format=gguf", "export.mask_file={tmp}/mask.json"],
        "export.format=gguf writes gpt_neox as llama.cpp's gptneox, whose graph reads q, k and v as blocks of the hidden size",
        "mask_dec_heads",
    ),
    (
        "export-gguf-gemma-attention-scale-llama-cpp-does-not-take",
        "lm",
        [
            "experiment=export",
            "model=tiny_gemma",
            "model.config.query_pre_attn_scalar=32",
            "export.format=gguf",
            "export.mask_file={tmp}/mask.json",
        ],
        "export.format=gguf writes gemma2 as llama.cpp's gemma2, and this model has query_pre_attn_scalar 32, not the head size 16",
        "mask_dec_heads",
    ),
    (
        "export-deci-hf-gpt2-family",
        "lm",
        ["experiment=export", "model=tiny_gpt2", "export.format=deci_hf", "export.mask_file={tmp}/mask.json"],
        "export.format=deci_hf writes Llama and Mistral decoders (llama, mistral) as vLLM's DeciLMForCausalLM",
        "mask_dec_heads",
    ),
    (
        "export-deci-hf-kv-heads-not-dividing-the-query-heads",
        "lm",
        ["experiment=export", "export.format=deci_hf", "export.mask_file={tmp}/mask.json", "model.config.num_key_value_heads=4"],
        "layer 0 keeps 3 KV heads; vLLM's nemotron_nas runs num_attention_heads=4 query heads",
        "mask_dec_three",
    ),
    # long-context tasks: passkey prompts that cannot be built, long documents
    ("passkey-context-past-positions", "passkey", ["experiment=ablate", "data.context_lengths=[96,200]"], "at most 128 positions", None),
    (
        "passkey-context-and-answer-past-positions",
        "passkey",
        ["experiment=ablate", "data.context_lengths=[126]"],
        "and its answer of",
        None,
    ),
    ("passkey-depth-above-one", "passkey", ["experiment=ablate", "data.depths=[0.5,1.5]"], "data.depths must be in [0.0, 1.0]", None),
    ("passkey-depth-negative", "passkey", ["experiment=prune", "data.depths=-0.1"], "data.depths must be in [0.0, 1.0]", None),
    (
        "passkey-key-longer-than-context",
        "passkey",
        ["experiment=ablate", "data.key_digits=12", "data.context_lengths=[10]"],
        "longer than the context of 10 tokens",
        None,
    ),
    (
        "passkey-haystack-files-missing",
        "passkey",
        ["experiment=ablate", "data=passkey_local", "data.dir={tmp}/nothing", "data.context_lengths=[96]"],
        "haystack text file",
        None,
    ),
    ("passkey-haystack-empty", "passkey", ["experiment=ablate", *HAYSTACK_FILES], "the heldout haystack holds no text", "haystack_empty"),
    (
        "passkey-repeat-without-sentences",
        "passkey",
        ["experiment=ablate", "data=passkey_repeat", "data.repeat=[]", "data.context_lengths=[96]"],
        "data.source=repeat needs the haystack's sentences in data.repeat",
        None,
    ),
    (
        "passkey-repeat-given-to-another-source",
        "passkey",
        ["experiment=ablate", "data.repeat=[The sky is blue.]"],
        "data.repeat is read only with data.source=repeat, but data.source=synthetic",
        None,
    ),
    (
        "passkey-repeat-with-files",
        "passkey",
        ["experiment=ablate", "data=passkey_repeat", "data.files={{eval:[eval.txt]}}", "data.context_lengths=[96]"],
        "data.files is read only with data.source=local",
        None,
    ),
    (
        "passkey-context-too-short-for-needle-and-question",
        "passkey",
        ["experiment=ablate", "data.context_lengths=[20]"],
        "too short for the intro, 1 needle(s) and the question",
        None,
    ),
    ("passkey-needles-beyond-names", "passkey", ["experiment=ablate", "data.needles=12"], "give one name per needle", None),
    (
        "passkey-needle-without-key",
        "passkey",
        ["experiment=ablate", "data.template.needle='The pass key is here.'"],
        "lacks ['{key}']",
        None,
    ),
    ("passkey-ask-bogus", "passkey", ["experiment=ablate", "data.ask=some"], "data.ask must be one of", None),
    ("passkey-metric-bogus", "passkey", ["experiment=ablate", "data.metric=bleu"], "data.metric must be one of", None),
    ("passkey-no-importance", "passkey", ["experiment=prune", "data.sizes.importance=0"], "data.sizes.importance=0", None),
    ("passkey-keys-too-few", "passkey", ["experiment=ablate", "data.key_digits=1"], "too few for", None),
    (
        "passkey-hub-offline",
        "passkey",
        ["experiment=ablate", "data=passkey_hub", "data.hub_path=headprune-tests/no-such-texts", "data.context_lengths=[96]"],
        "the hub cannot be reached",
        None,
    ),
    (
        "lm-long-document-beyond-max-length",
        "lm",
        ["experiment=ablate", "data=lm_long", "data.max_length=64", "data.document_tokens=100"],
        "data.document_tokens=100",
        None,
    ),
    (
        "stream-span-covers-context",
        "lm",
        ["experiment=prune", "prune.action=stream", "prune.stream.window=44"],
        "= 48 tokens reach the whole context of data=lm_synthetic (48 tokens at most): a streamed unit would keep every key and "
        "nothing would be saved",
        None,
    ),
    ("stream-on-encoder", "nli", ["experiment=ablate", "prune.action=stream"], "an encoder (attention groups ['enc_self'])", None),
    ("stream-on-seq2seq", "mt", ["experiment=prune", "prune.action=stream"], "an encoder-decoder (attention groups", None),
    (
        "stream-window-beyond-positions",
        "lm",
        ["experiment=prune", "prune.action=stream", "prune.stream.window=200"],
        "prune.stream.window=200 is larger than model tiny_llama's 128 positions",
        None,
    ),
    (
        "stream-settings-with-remove",
        "lm",
        ["experiment=prune", "prune.stream.window=8"],
        "prune.stream.window=8 would be ignored: prune.stream.* sets what a streamed unit still sees, and prune.action=remove",
        None,
    ),
    (
        "stream-entropy-order",
        "lm",
        ["experiment=prune", "prune.action=stream", "prune.order=entropy"],
        "prune.order=entropy with prune.action=stream: the entropy order ranks heads by how diffuse their attention is",
        None,
    ),
    (
        "stream-ffn-unit",
        "lm",
        ["experiment=prune", "prune.action=stream", "prune.unit=ffn"],
        "prune.unit=ffn with prune.action=stream",
        None,
    ),
    (
        "stream-for-speed",
        "lm",
        ["experiment=prune", "prune.action=stream", "prune.unit=kv_group", "prune.target={{flops:0.6}}"],
        "a streamed unit keeps its weights, its saving is the KV cache",
        None,
    ),
    ("stream-on-speed", "lm", ["experiment=speed", "prune.action=stream"], "prune.action=stream is not read by experiment=speed", None),
    ("duo-with-remove", "lm", ["experiment=prune", "prune.order=duo"], "prune.order=duo needs prune.action=stream", None),
    (
        "duo-settings-without-duo",
        "lm",
        ["experiment=prune", "prune.action=stream", "prune.duo.steps=5"],
        "prune.duo.steps=5 would be ignored",
        None,
    ),
    (
        "stream-patterns-as-speed-mask",
        "lm",
        ["experiment=speed", "speed.mask_file={tmp}/stream.json"],
        "holds the patterns of a prune.action=stream run",
        "stream_results",
    ),
    (
        "retrieval-order-without-needles",
        "lm",
        ["experiment=prune", "prune.order=retrieval"],
        "and data=lm_synthetic (the lm task) has no needles: use data=passkey_synthetic",
        None,
    ),
    ("speed-mask-order-duo", "lm", ["experiment=speed", "speed.mask_order=duo"], "prune.order=duo needs prune.action=stream", None),
    ("ffn-multiple-zero", "lm", ["experiment=prune", "prune.ffn_multiple=0"], "prune.ffn_multiple", None),
    (
        "ffn-multiple-without-ffn",
        "lm",
        ["experiment=prune", "prune.ffn_multiple=32"],
        "prune.ffn_multiple=32 rounds the FFN widths, and prune.unit=head prunes no FFN neurons",
        None,
    ),
    (
        "ffn-multiple-with-schedule",
        "lm",
        ["experiment=prune", "prune.unit=ffn", "prune.ffn_multiple=32", "prune.schedule=[0.2,0.4]"],
        "prune.ffn_multiple=32 rounds one-shot masks",
        None,
    ),
    (
        "ffn-multiple-with-reestimate",
        "lm",
        ["experiment=prune", "prune.unit=ffn", "prune.ffn_multiple=32", "prune.reestimate=true"],
        "rounds the masks of fixed scores",
        None,
    ),
    ("hidden-multiple-zero", "lm", ["experiment=prune", "prune.unit=hidden", "prune.hidden_multiple=0"], "prune.hidden_multiple", None),
    (
        "hidden-multiple-not-integer",
        "lm",
        ["experiment=prune", "prune.unit=hidden", "prune.hidden_multiple=2.5"],
        "prune.hidden_multiple",
        None,
    ),
    (
        "hidden-multiple-without-hidden",
        "lm",
        ["experiment=prune", "prune.unit=[kv_group,ffn]", "prune.hidden_multiple=8"],
        "prune.hidden_multiple=8 rounds the kept width of a kind prune.unit=kv_group+ffn does not prune",
        None,
    ),
    (
        "hidden-multiple-above-width",
        "lm",
        ["experiment=prune", "prune.unit=hidden", "prune.hidden_multiple=64"],
        "prune.hidden_multiple=64 is larger than the 32 channels of model tiny_llama",
        None,
    ),
    ("scores-from-missing", "lm", ["experiment=prune", "prune.scores_from={tmp}/none.json"], "none.json: no such file", None),
    (
        "scores-from-run-directory",
        "lm",
        ["experiment=prune", "prune.scores_from={tmp}/prior"],
        "prior is a directory (did you mean",
        "prior_run",
    ),
    ("scores-from-not-json", "lm", ["experiment=prune", "prune.scores_from={tmp}/mask.json"], "not JSON (line 1", "mask_text"),
    (
        "scores-from-pareto-run",
        "lm",
        ["experiment=prune", "prune.scores_from={tmp}/pareto.json"],
        "holds no pruning curves (results.orders)",
        "pareto_results",
    ),
    (
        "scores-from-order-missing",
        "lm",
        ["experiment=prune", "prune.scores_from={tmp}/scored.json", "prune.order=[importance,fisher]"],
        "has no fisher order (it has ['importance'])",
        "scored_results",
    ),
    (
        "scores-from-other-unit",
        "lm",
        ["experiment=prune", "prune.scores_from={tmp}/scored.json", "prune.unit=kv_group"],
        "ranks prune.unit=head, and this run has prune.unit=kv_group",
        "scored_results",
    ),
    (
        "scores-from-other-action",
        "lm",
        ["experiment=prune", "prune.scores_from={tmp}/scored.json", "prune.action=stream", "prune.stream.window=8"],
        "ranks prune.action=remove, and this run has prune.action=stream",
        "scored_results",
    ),
    (
        "scores-from-not-recorded",
        "lm",
        ["experiment=prune", "prune.scores_from={tmp}/stream.json", "prune.action=stream", "prune.unit=kv_group", "prune.stream.window=8"],
        "its importance order recorded no scores",
        "stream_results",
    ),
    (
        "scores-from-with-reestimate",
        "lm",
        ["experiment=prune", "prune.scores_from={tmp}/scored.json", "prune.reestimate=true"],
        "reads fixed scores, and prune.reestimate=true",
        "scored_results",
    ),
    (
        "scores-from-for-speed",
        "lm",
        ["experiment=prune", "prune.scores_from={tmp}/scored.json", "prune.target={{flops:0.6}}"],
        "ranks the plain pruning curves",
        "scored_results",
    ),
    (
        "scores-from-in-study",
        "lm",
        ["experiment=study", "prune.scores_from={tmp}/scored.json"],
        "the study scores its own orders",
        "scored_results",
    ),
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
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the same answers on a machine with a GPU
    if files:
        PRE[files](tmp_path)
    start = time.perf_counter()
    with pytest.raises((ValueError, FileNotFoundError)) as err:
        validate(compose_row(tmp_path, task, overrides, model_dirs))
    assert words in str(err.value), str(err.value)
    assert "delete" not in str(err.value), str(err.value)  # what the user gave is an input: never advise deleting it
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
    ("cli-min-units", ["experiment=prune", "prune.min_units_per_layer=20"], "min_units_per_layer"),
    ("cli-min-heads-old-key", ["experiment=prune", "prune.min_heads_per_layer=1"], "give prune.min_units_per_layer=1"),
    ("cli-pretrained-relative", ["experiment=ablate", "model.pretrained=outputs/nope/train/model"], "not found"),
    ("cli-study-batch-zero", ["experiment=study", "speed.batch_sizes=[0]"], "speed.batch_sizes"),
    ("cli-prune-speedup-one", ["experiment=prune", "prune.target={speedup:1}"], "must be > 1"),
    ("cli-prune-two-targets", ["experiment=prune", "prune.target={speedup:1.3,max_drop:1}"], "exactly one"),
    ("cli-prune-order-empty", ["experiment=prune", "prune.order=[]"], "prune.order is empty"),
    ("cli-schedule-fraction-and-target", ["experiment=prune", "prune.schedule=[0.2,{speedup:1.2}]"], "not a mix"),
    ("cli-decay-maybe", ["experiment=prune", "prune.finetune.decay=maybe"], "must be true or false"),
    ("cli-sweep-one-bad-job", ["-m", "experiment=prune", "prune.order=importance,magnitude"], "prune.order=magnitude"),
    ("cli-sweep-bad-job-later", ["-m", "experiment=ablate", "ablate.alpha=0.01,5"], "sweep job 1"),
    ("cli-mask-step-unquoted", ["experiment=speed", "speed.mask_step=speedup=1.3"], "\"speed.mask_step='speedup=1.3'\""),
    (
        "cli-sweep-bad-fraction",
        ["-m", "experiment=prune", "prune.fractions=0.5,abc"],
        "prune.fractions must be a number, got 'abc'; no job was run",
    ),
    ("cli-run-dir-is-a-file", ["experiment=ablate", "hydra.run.dir={tmp}/a_file"], "a_file is a file, not a directory"),
    ("cli-run-dir-under-a-file", ["experiment=ablate", "hydra.run.dir={tmp}/a_file/run"], "a_file is a file, not a directory"),
    ("cli-flash-attention-without-package", ["experiment=ablate", "model.attn_implementation=flash_attention_2"], "flash_attention_2"),
    ("cli-synthetic-train-zero", ["experiment=nli_finetune", "data.synthetic.train_size=0"], "data.synthetic.train_size"),
    ("cli-model-type-unknown", ["experiment=inspect", "model.config.model_type=foobar"], "model_type='foobar'"),
]


@pytest.mark.parametrize("overrides,words", [pytest.param(*row[1:], id=row[0]) for row in CLI_ROWS])
def test_cli_error(tmp_path, no_forward, monkeypatch, capsys, overrides, words):
    from headprune import cli

    monkeypatch.delenv("HYDRA_FULL_ERROR", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "a_file").write_text("")  # for rows that give it as a directory
    overrides = [o.replace("{tmp}", str(tmp_path)) for o in overrides]
    argv = [
        "headprune",
        *[o for o in NLI if not o.startswith("data.")],
        "data.synthetic.train_size=240",
        "data.importance_size=40",  # at most half the training examples (the importance subset is held out)
        "logger=none",
        "device=cpu",
        *[o for o in overrides if not o.startswith("-")],
        f"hydra.run.dir={tmp_path}/run",
        f"hydra.sweep.dir={tmp_path}/sweep",
        f"paths.data_dir={tmp_path}/data",
    ]
    argv[1:1] = [o for o in overrides if o.startswith("-")]  # Hydra's flags first
    monkeypatch.setattr(sys, "argv", argv)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as done:
        cli.main()
    message = capsys.readouterr().err
    assert done.value.code == 2 and words in message, message
    assert "Traceback" not in message, message
    assert "no job was run" in message or not overrides[0].startswith("-m")
    assert time.perf_counter() - start < SECONDS
    assert not list(tmp_path.rglob("results.json"))  # no job ran


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
    from headprune.tasks.nli.files import read_split

    read_split(write_nli(tmp_path / "nli", "utf8") / "dev_matched.jsonl")


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

    from headprune.core.attention.gates import HeadGates

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
    for name, keys in (("config.json", ["headprune_pruned_heads"]), ("headprune_pruning.json", ["kinds", "head", "pruned_heads"])):
        path = tmp_path / "pruned" / name
        saved = json.loads(path.read_text())
        entry = saved
        for key in keys[:-1]:
            entry = entry[key]
        entry[keys[-1]] = {"enc_self": {"0": [2]}}  # the same count, another head
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

    from headprune.core.attention.gates import HeadGates
    from headprune.core.units import unit_gates

    model = BertModel(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16))
    unit_gates(HeadGates(model), "kv_group")


def _saved_tiny(tmp_path) -> Path:
    from headprune.core.pruning import prune_heads
    from headprune.core.saving import save_pruned

    model, _ = _tiny_gates()
    prune_heads(model, {"enc_self": {"0": [1]}})
    return save_pruned(model, tmp_path / "pruned")


def _truncated(name: str):
    def call(tmp_path):
        from headprune.core.saving import load_pruned

        path = _saved_tiny(tmp_path) / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        load_pruned(tmp_path / "pruned")

    return call


def _importance_without_labels(tmp_path):
    from headprune.scoring.importance import importance_scores

    model, gates = _tiny_gates()
    batch = {"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    importance_scores(model, gates, [batch])


def _schedule(steps):
    def call(tmp_path):
        from headprune.selection.schedule import check_schedule

        check_schedule(steps)

    return call


def _iterative_prune_shrinking(tmp_path):
    from headprune.selection.costs import flops_cost_model
    from headprune.selection.schedule import iterative_prune

    model, _ = _tiny_gates()
    iterative_prune(model, [{"speedup": 1.5}, {"speedup": 1.2}], [], costs=flops_cost_model(model, seq_len=8))


def _lm_read_texts_utf8(tmp_path):
    from headprune.tasks.lm.data import read_texts

    read_texts(write_lm(tmp_path / "lm", "utf8") / "heldout.txt")


def _resolve_config_json(tmp_path):
    from headprune.models.sources import resolve_pretrained

    (tmp_path / "config.json").write_text("{}")
    resolve_pretrained(str(tmp_path / "config.json"))


def _time_budget(tmp_path):
    """A call slower than the whole budget (as a long generation): stopped at the budget, with a clear error."""
    from headprune.engine.timing import compare_throughput

    slow = {name: (lambda batch: time.sleep(0.3)) for name in ("original", "pruned")}
    batches = [{"input_ids": torch.ones(1, 4, dtype=torch.long)}] * 20  # 6 s a pass without the budget
    compare_throughput(slow, batches, warmup=0, repeats=2, max_seconds=0.2)


def _read_truncated_checkpoint(tmp_path):
    from headprune.lightning.trainer import read_training_checkpoint

    read_training_checkpoint(truncated_checkpoint(tmp_path / "epoch=1.ckpt"))


def _gain_of_nothing(tmp_path):
    from headprune.engine.verdict import gain_summary

    gain_summary([], [])


def _raw_mask_no_order(tmp_path):
    from headprune.results.mask_files import choose_candidate, mask_file_of

    path = prune_results_file(tmp_path)
    choose_candidate(mask_file_of(json.loads(path.read_text()), path), "fisher", 0.25, None, "speed")


def _flops_target_one(tmp_path):
    from headprune.selection.mask_search import PruneTarget

    PruneTarget("flops", 1.0)


def _ffn_mask_shape(tmp_path):
    from headprune.core.ffn.gates import FFNGates

    model, _ = _tiny_gates()
    FFNGates(model).set_mask({"enc_ffn": torch.ones(3, 65)})


def _prune_ffn_mask_half(tmp_path):
    from headprune.core.ffn.pruning import prune_ffn_mask

    model, _ = _tiny_gates()
    prune_ffn_mask(model, {"enc_ffn": torch.full((3, 64), 0.5)})


def _joint_mask_unknown_group(tmp_path):
    from headprune.core.units import unit_gates

    model, _ = _tiny_gates()
    unit_gates(model, "head+ffn").set_mask({"ffn": torch.ones(3, 64)})


def _ffn_without_mlp_layout(tmp_path):
    from dataclasses import replace

    from headprune.core import families
    from headprune.core.ffn.gates import FFNGates

    model, _ = _tiny_gates()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(families, "FAMILIES", tuple(replace(f, mlp=None) for f in families.FAMILIES))
        FFNGates(model)


def _edited_ffn_record(tmp_path):
    from headprune.core.ffn.pruning import prune_neurons
    from headprune.core.saving import load_pruned, save_pruned

    model, _ = _tiny_gates()
    prune_neurons(model, {"enc_ffn": {"0": [1, 2]}})
    save_pruned(model, tmp_path / "pruned")
    path = tmp_path / "pruned" / "headprune_pruning.json"
    saved = json.loads(path.read_text())
    saved["kinds"]["ffn"]["pruned_neurons"] = {"enc_ffn": {"0": [1, 3]}}  # the same width, another neuron
    path.write_text(json.dumps(saved))
    load_pruned(tmp_path / "pruned")


def _load_pruned(path):
    def call(tmp_path):
        from headprune.core.saving import load_pruned

        (tmp_path / "a_file").write_text("")
        load_pruned(path if not isinstance(path, str) or "{tmp}" not in path else path.format(tmp=tmp_path))

    return call


def _prune_mask_value(value):
    def call(tmp_path):
        from headprune.core.pruning import prune_mask

        model, _ = _tiny_gates()
        prune_mask(model, value)

    return call


def _load_pruned_foreign_type(tmp_path):
    from headprune.core.saving import load_pruned

    load_pruned(foreign_model_dir(tmp_path / "foobar", "foobar"))


def _unit_of_overlapping_kinds(tmp_path):
    from headprune.core.units import unit_gates

    model, _ = _tiny_gates()
    unit_gates(model, ["head", "block"])


def _single_neuron_ablation(tmp_path):
    from headprune.core.units import unit_gates
    from headprune.engine.ablation import single_unit_masks

    model, _ = _tiny_gates()
    single_unit_masks(unit_gates(model, "ffn").groups, unit="ffn")


def _block_mask_shape(tmp_path):
    from headprune.core.units import unit_gates

    model, _ = _tiny_gates()
    unit_gates(model, "block").set_mask({"enc_self_block": torch.ones(3, 2)})


def _unit_gates_of(model_or_text, unit):
    def call(tmp_path):
        from headprune.core.units import unit_gates

        unit_gates(_tiny_gates()[0] if model_or_text is None else model_or_text, unit)

    return call


def _save_pruned_onto_file(tmp_path):
    from headprune.core.saving import save_pruned

    (tmp_path / "taken").write_text("a file")
    save_pruned(_tiny_gates()[0], tmp_path / "taken")


def _stream_results(tmp_path) -> Path:
    """A streaming run's results.json with one importance step at fraction 0.5 (sink 1, window 4)."""
    results = {
        "action": "stream",
        "unit": "kv_group",
        "stream": {"sink": 1, "window": 4},
        "orders": {"importance": {"steps": [{"fraction": 0.5, "mask": {"dec_self": [[1, 0], [0, 1]]}}]}},
    }
    (tmp_path / "run").mkdir(exist_ok=True)
    path = tmp_path / "run" / "results.json"
    path.write_text(json.dumps({"results": results, "config": {"model": {"name": "tiny"}}}))
    return path


def _write_run_pattern_onto_file(tmp_path):
    from headprune.export.kvpress import write_run_pattern

    (tmp_path / "taken").write_text("a file")
    write_run_pattern(_stream_results(tmp_path), tmp_path / "taken", "importance", 0.5)


def _write_run_pattern_run_dir(tmp_path):
    from headprune.export.kvpress import write_run_pattern

    write_run_pattern(_stream_results(tmp_path).parent, tmp_path / "pattern", "importance", 0.5)


def _kvpress_one_kv_head(tmp_path):
    from headprune.export.kvpress import write_kvpress_pattern

    write_kvpress_pattern(tmp_path / "pattern", torch.tensor([[1.0], [0.0], [1.0]]), 4, 16, "gemma-like")


def _mask_row_wrong_length(tmp_path):
    from headprune.core.pruning import prune_mask

    model, _ = _tiny_gates()
    prune_mask(model, {"enc_self": [[1, 1, 1, 1], [1, 0, 1], [1, 1, 1, 1]]})


def _scores_of_another_model(tmp_path):
    from types import SimpleNamespace

    from headprune.sources.score_file import given_scores

    model, gates = _tiny_gates()
    scores = {"enc_self": [[0.1, 0.2, 0.3, 0.4]] * 3}
    payload = {
        "inputs": {"model": "tiny_gemma"},
        "fingerprints": {"model": "0123456789abcdef"},
        "results": {"action": "remove", "unit": "head", "orders": {"importance": {"steps": [], "head_scores": scores}}},
    }
    (tmp_path / "scored.json").write_text(json.dumps(payload))
    given_scores(tmp_path / "scored.json", ["importance"], SimpleNamespace(model=model, gates=gates), "tiny_bert")


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
    pytest.param(_truncated("model.safetensors"), "model.safetensors cannot be read", id="api-load-pruned-truncated-weights"),
    pytest.param(_truncated("headprune_pruning.json"), "headprune_pruning.json is not valid JSON", id="api-load-pruned-truncated-record"),
    pytest.param(_truncated("config.json"), "config.json cannot be read", id="api-load-pruned-truncated-config"),
    pytest.param(_importance_without_labels, "needs each batch's labels", id="api-importance-without-labels"),
    pytest.param(_schedule([0.2, {"speedup": 1.2}]), "not a mix", id="api-schedule-fraction-and-target"),
    pytest.param(_schedule([{"speedup": 1.5}, {"speedup": 1.2}]), "already met", id="api-schedule-shrinking-speedup"),
    pytest.param(_schedule([{"speedup": 1.2}, {"flops": 0.9}]), "one kind", id="api-schedule-mixed-kinds"),
    pytest.param(_iterative_prune_shrinking, "already met", id="api-iterative-prune-shrinking-targets"),
    pytest.param(_lm_read_texts_utf8, "heldout.txt:3", id="api-lm-read-texts-utf8"),
    pytest.param(_resolve_config_json, "is a file", id="api-resolve-pretrained-config-json"),
    pytest.param(_time_budget, "speed.max_seconds=0.2 ran out", id="api-time-budget-bounds-a-slow-call"),
    pytest.param(_gain_of_nothing, "no timed repeats", id="api-gain-without-repeats"),
    pytest.param(_read_truncated_checkpoint, "epoch=1.ckpt cannot be read", id="api-read-truncated-checkpoint"),
    pytest.param(_raw_mask_no_order, "has no order 'fisher'", id="api-speed-mask-order-missing"),
    pytest.param(_flops_target_one, "removes nothing", id="api-flops-target-one"),
    pytest.param(_ffn_mask_shape, "expected [3, 64] (layers x neurons)", id="api-ffn-mask-shape"),
    pytest.param(_prune_ffn_mask_half, "0 (remove the neuron) or 1 (keep it)", id="api-prune-ffn-mask-half"),
    pytest.param(_joint_mask_unknown_group, "the ffn groups ['enc_ffn']", id="api-joint-mask-unknown-group"),
    pytest.param(_ffn_without_mlp_layout, "has no MLP layout", id="api-ffn-unit-without-mlp-layout"),
    pytest.param(_edited_ffn_record, "SHA-256", id="api-edited-ffn-record"),
    pytest.param(_load_pruned(None), "load_pruned takes the directory save_pruned", id="api-load-pruned-none"),
    pytest.param(_load_pruned(""), "load_pruned got an empty path", id="api-load-pruned-empty-path"),
    pytest.param(_load_pruned("{tmp}/nothing"), "nothing does not exist", id="api-load-pruned-missing-dir"),
    pytest.param(_load_pruned("{tmp}/a_file"), "a_file is a file", id="api-load-pruned-a-file"),
    pytest.param(
        _prune_mask_value({"enc_self": "abc"}),
        "mask for group 'enc_self' must be a tensor or nested list of numbers of shape [3, 4]",
        id="api-prune-mask-text",
    ),
    pytest.param(_prune_mask_value({"enc_self": [[1, 0], [1]]}), "got list [[1, 0], [1]]", id="api-prune-mask-ragged"),
    pytest.param(_prune_mask_value({"enc_self": {"0": [1]}}), "is what prune_heads takes", id="api-prune-mask-head-ids"),
    pytest.param(_prune_mask_value(None), "the mask is None", id="api-prune-mask-none"),
    pytest.param(_load_pruned_foreign_type, "model_type='foobar', which headprune does not support", id="api-load-pruned-unknown-type"),
    pytest.param(_unit_of_overlapping_kinds, "which both prune the attention part", id="api-unit-overlapping-kinds"),
    pytest.param(_single_neuron_ablation, "no useful pruning order", id="api-single-neuron-ablation"),
    pytest.param(_block_mask_shape, "(layers x blocks)", id="api-block-mask-shape"),
    pytest.param(_unit_gates_of(None, None), "a unit is a kind's name or a list of names", id="api-unit-gates-unit-none"),
    pytest.param(_unit_gates_of(None, 3), "got int 3", id="api-unit-gates-unit-number"),
    pytest.param(_unit_gates_of("model", "head"), "unit_gates takes a model (torch nn.Module)", id="api-unit-gates-text-model"),
    pytest.param(_save_pruned_onto_file, "save_pruned takes a directory to write the model into", id="api-save-pruned-onto-file"),
    pytest.param(_write_run_pattern_onto_file, "writes the pattern into a directory", id="api-write-run-pattern-onto-file"),
    pytest.param(_write_run_pattern_run_dir, "takes a streaming run's results.json, got the directory", id="api-write-run-pattern-run-dir"),
    pytest.param(_kvpress_one_kv_head, "reads back 1-D in kvpress", id="api-kvpress-one-kv-head"),
    pytest.param(_mask_row_wrong_length, "layer 1 has 3 values, expected 4 (one per head)", id="api-mask-row-wrong-length"),
    pytest.param(
        _scores_of_another_model,
        "scored tiny_gemma (model fingerprint 0123456789abcdef), and this run prunes tiny_bert",
        id="api-scores-from-another-model",
    ),
]


@pytest.mark.parametrize("call,words", API_ROWS)
def test_api_error(tmp_path, no_forward, monkeypatch, call, words):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    with pytest.raises((ValueError, FileNotFoundError, FileExistsError, IndexError, TypeError)) as err:
        call(tmp_path)
    assert words in str(err.value), str(err.value)
    assert time.perf_counter() - start < SECONDS


# ---- warning rows: allowed, but a ConfigWarning says it does nothing ---------------------------------

WARNING_ROWS = [
    ("warn-unknown-top-level-key", "nli", ["experiment=prune", "+foo=1"], "['foo']"),
    ("warn-misplaced-prune-setting", "mt", ["experiment=ablate", "+step=0.2"], "prune.step, not +step"),
    (
        "warn-recover-examples-above-importance",
        "nli",
        ["experiment=prune", "prune.recover=lsq", "prune.recover_examples=3000"],
        "prune.recover_examples=3000 exceeds",
    ),
]


@pytest.mark.parametrize("task,overrides,words", [pytest.param(*row[1:], id=row[0]) for row in WARNING_ROWS])
def test_config_warning(tmp_path, no_forward, monkeypatch, task, overrides, words):
    from headprune.core.checks import ConfigWarning
    from headprune.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.warns(ConfigWarning, match=".") as caught:
        validate(compose_row(tmp_path, task, overrides))
    assert any(words in str(w.message) for w in caught), [str(w.message) for w in caught]


def test_known_settings_do_not_warn(tmp_path, no_forward, monkeypatch):
    import warnings

    from headprune.core.checks import ConfigWarning
    from headprune.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        for experiment in ("prune", "study", "speed"):
            validate(compose_row(tmp_path, "nli", [f"experiment={experiment}"]))


# ---- process rows: the installed command, one message on stderr and status 2 -----------------------

PROCESS_ROWS = [
    ("proc-config-error", ["experiment=prune", "+foo=1", "prune.order=[]"], "prune.order is empty"),
    ("proc-composition-error", ["experiment=prune", "prune.nope=1"], "nope"),
]


def _headprune(tmp_path, overrides: list[str], *extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"} | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "headprune.cli", *extra, *NLI, "logger=none", "device=cpu", *overrides]
    command += [f"hydra.run.dir={tmp_path}/run", f"paths.data_dir={tmp_path}/data"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # two to three interpreter starts
@pytest.mark.parametrize("overrides,words", [pytest.param(*row[1:], id=row[0]) for row in PROCESS_ROWS])
def test_command_prints_one_message(tmp_path, overrides, words):
    """An input failure: its message on stderr, no traceback, status 2; ``--verbose`` adds the traceback."""
    done = _headprune(tmp_path, overrides)
    assert done.returncode == 2, done.stderr[-2000:]
    assert words in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "run" / "results.json").exists()
    if overrides == PROCESS_ROWS[0][1]:
        assert "headprune: warning: setting(s) ['foo']" in done.stderr  # a warning is one line too
        loud = _headprune(tmp_path, overrides, "--verbose")
        assert loud.returncode == 2 and "Traceback" in loud.stderr and words in loud.stderr


def test_table_is_complete():
    """At least 150 bad inputs, each with its own id (recovered and warning rows included)."""
    rows = CONFIG_ROWS + RECOVERED_ROWS + CLI_ROWS + WARNING_ROWS + PROCESS_ROWS
    ids = [row[0] for row in rows] + [p.id for p in API_ROWS]
    assert len(ids) >= 150 and len(ids) == len(set(ids))
    assert os.environ.get("HF_HUB_OFFLINE") == "1"  # set by conftest: nothing loads from the hub


# ---- run rows: refused by the run before any scoring (what validation cannot know without the model) ----------


@pytest.mark.parametrize(
    "overrides,words",
    [
        pytest.param(["prune.target={{speedup:100}}"], "cannot be met", id="run-unreachable-speedup"),
        pytest.param(["prune.schedule=[{{flops:0.5}},{{flops:0.01}}]"], "choose a target within reach", id="run-unreachable-flops-step"),
        pytest.param(
            ["prune.target={{speedup:1.3}}", "prune.cost=latency"], "latency tables measured here are flat", id="run-flat-latency"
        ),
        pytest.param(
            ["prune.unit=[head,ffn]", "prune.layout=uniform", "prune.min_units_per_layer=1", "prune.target={{flops:0.2}}"],
            "cannot be met in the uniform layout",
            id="run-uniform-joint-unreachable-flops",
        ),
    ],
)
def test_unreachable_target_is_refused_before_scoring(tmp_path, monkeypatch, overrides, words):
    from hydra.utils import get_method

    from headprune.core.checks import ConfigError
    from headprune.selection import latency
    from headprune.selection.costs import CostModel
    from headprune.stages import prune_speed
    from headprune.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    flat = lambda model, inputs, unit="head", device="cpu", **kwargs: CostModel("seconds", 1.0, {"enc_self": torch.ones(2, 5)})  # noqa: E731
    monkeypatch.setattr(latency, "measure_unit_latency_model", flat)
    monkeypatch.setattr(prune_speed, "order_scores", lambda *a, **k: pytest.fail("scored before refusing the target"))
    cfg = compose_row(tmp_path, "nli", ["experiment=prune", "prune.order=fisher", *overrides])
    validate(cfg)
    with pytest.raises(ConfigError) as err:
        get_method(cfg.run)(cfg)
    assert words in str(err.value), str(err.value)


# ---- advice names what the user set; a cached hub dataset is no error ----------------------------------


@pytest.mark.parametrize(
    "task,overrides",
    [
        pytest.param("lm", ["data=lm_local", "data.dir={tmp}/nothing", "data.max_length=64"], id="lm"),
        pytest.param("mt", ["data=mt_multi30k", "data.dir={tmp}/nothing"], id="mt"),
        pytest.param("nli", ["data=nli_local", "data.dir={tmp}/nothing"], id="nli"),
    ],
)
def test_data_dir_advice_names_data_dir_only(tmp_path, no_forward, monkeypatch, task, overrides):
    """With data.dir given, the advice points at data.dir, never at paths.data_dir (which no longer decides the directory)."""
    from headprune.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError) as err:
        validate(compose_row(tmp_path, task, ["experiment=ablate", *overrides]))
    assert "data.dir" in str(err.value) and "paths.data_dir" not in str(err.value), str(err.value)


def test_a_cached_hub_dataset_passes_offline(tmp_path, monkeypatch):
    """Offline, a hub dataset that datasets prepared once (its cache folder) passes the check; another is refused."""
    import datasets

    from headprune.core.checks import ConfigError
    from headprune.tasks.data_sources import check_hub_dataset

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path))
    (tmp_path / "ylecun___mnist" / "mnist" / "0.0.0" / "abc123").mkdir(parents=True)  # as load_dataset leaves it
    data = {"name": "image_hub"}
    check_hub_dataset(data, "ylecun/mnist", "data.hub_path", "data=image_digits")
    with pytest.raises(ConfigError, match="uoft-cs/cifar10 is not in the datasets cache"):
        check_hub_dataset(data, "uoft-cs/cifar10", "data.hub_path", "data=image_digits")


def test_ffn_unit_on_a_family_without_mlp_layout(tmp_path, no_forward, monkeypatch):
    """prune.unit holding ffn on a family row that declares no MLP layout is refused before work, naming the family."""
    import dataclasses

    from headprune.core import families
    from headprune.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rows = tuple(dataclasses.replace(f, mlp=None) if "bert" in f.model_types else f for f in families.FAMILIES)
    monkeypatch.setattr(families, "FAMILIES", rows)
    with pytest.raises(ValueError, match="declares no MLP layout"):
        validate(compose_row(tmp_path, "nli", ["experiment=prune", "prune.unit=[head,ffn]"]))


def test_finetune_budget_beyond_the_training_split_is_refused_before_scoring(tmp_path, monkeypatch):
    """prune.finetune.tokens above what the training split holds: refused by the run before any forward pass, with the count."""
    from hydra.utils import get_method

    from headprune.core.checks import ConfigError
    from headprune.validation import validate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = compose_row(tmp_path, "lm", ["experiment=prune", "prune.recover=finetune", "prune.finetune.tokens=10000000"])
    validate(cfg)
    monkeypatch.setattr(torch.nn.Module, "__call__", lambda self, *a, **k: pytest.fail(f"{type(self).__name__} ran before the refusal"))
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        get_method(cfg.run)(cfg)
    assert "prune.finetune.tokens=10000000: the training split holds only" in str(err.value), str(err.value)
    assert "set prune.finetune.tokens to at most" in str(err.value)
    assert time.perf_counter() - start < SECONDS
