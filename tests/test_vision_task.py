"""The vision task (ViT/DeiT image classification): its protocol on a tiny ViT, its data sources, its config check,
a fine-tune on scikit-learn's digits to a real score, the unchanged study on it, and an ONNX export of a pruned ViT."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from experiment_helpers import compose_cfg
from omegaconf import open_dict

from headprune.core.attention.gates import HeadGates
from headprune.core.checks import ConfigError
from headprune.tasks.vision.processor import image_tokens

TOLERANCE = 1e-5  # relative to the logits' scale
VISION = [
    "model=tiny_vit",
    "data=image_digits",
    "data.eval_size=60",
    "data.importance_size=32",
    "data.limit_train=96",
    "logger=none",
    "device=cpu",
]


def vision_cfg(tmp_path, *overrides, experiment: str = "ablate"):
    return compose_cfg(tmp_path, [f"experiment={experiment}", *VISION, *overrides])


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    torch.set_num_threads(1)
    from headprune.tasks.registry import load_task

    return load_task(vision_cfg(tmp_path_factory.mktemp("vision")))


def masks_of(gates) -> list:
    """No mask, one head off, uneven heads per layer with an emptied layer, a random half."""
    one, uneven, half = gates.ones(), gates.ones(), gates.ones()
    one["enc_self"][1, 2] = 0
    uneven["enc_self"][0, [0, 3]] = 0
    uneven["enc_self"][2] = 0
    half["enc_self"] = (torch.rand(half["enc_self"].shape, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    return [None, one, uneven, half]


def masked_logits(task, mask, split: str = "eval") -> torch.Tensor:
    with torch.no_grad(), task.gates.masked(mask):
        return torch.cat([task(batch) for batch in task.data.loader(split)])


def test_evaluate_many_equals_evaluate_one_mask_at_a_time(task):
    """The batched engine scores every mask as the gated model does, up to examples whose top two logits tie within rounding."""
    masks = masks_of(task.gates)
    many = task.evaluate_many(masks, split="eval")
    for mask, batched in zip(masks, many):
        single = task.evaluate(mask, split="eval")
        assert batched.n == single.n == task.split_sizes()["eval"]
        logits = masked_logits(task, mask)
        top2 = logits.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > TOLERANCE * logits.abs().max()
        agree = torch.tensor(batched.per_example["correct"]) == torch.tensor(single.per_example["correct"])
        assert bool(agree[clear].all())


def test_per_example_loss_equals_a_loop_over_images(task):
    batch = next(iter(task.importance_batches()))
    losses = task.per_example_loss(batch)
    assert losses.shape == (len(batch["labels"]),)
    for i in range(len(losses)):
        alone = F.cross_entropy(task({"pixel_values": batch["pixel_values"][i : i + 1]}), batch["labels"][i : i + 1])
        assert float(losses[i]) == pytest.approx(float(alone), rel=TOLERANCE, abs=TOLERANCE)


def test_importance_batches_cover_the_held_out_images_once(task):
    from headprune.scoring.importance import importance_scores

    batches = list(task.importance_batches())
    assert sum(len(b["labels"]) for b in batches) == task.split_sizes()["importance"] == 32
    assert all(set(b) == {"pixel_values", "labels"} for b in batches)
    held = set(task.data.dataset("importance").fingerprints)
    assert not held & set(task.data.dataset("eval").fingerprints)
    scores = importance_scores(task.model, task.gates, batches)
    assert scores["enc_self"].shape == (4, 4) and bool(torch.isfinite(scores["enc_self"]).all())


def test_training_and_timing_batches(task):
    train = task.training_batches(40, seed=1)
    assert sum(len(b["labels"]) for b in train) == 40 and train[0]["pixel_values"].shape[1:] == (3, 16, 16)
    timing = task.timing_batches(batch_size=4, examples=8)
    assert len(timing) == 2 and timing[0]["pixel_values"].shape == (4, 3, 16, 16)
    tokens = (16 // 4) ** 2 + 1  # patches + CLS
    assert timing[0]["input_ids"].shape == (4, tokens) == (4, image_tokens(task.model))
    task.timed_calls()["forward"].call(timing[0])


def test_splits_are_disjoint_deterministic_and_fingerprinted(task, tmp_path):
    from headprune.tasks.vision.config import ImageDataConfig
    from headprune.tasks.vision.image_sources import split_pool

    config = ImageDataConfig.from_cfg(vision_cfg(tmp_path).data)
    parts = split_pool(list(range(500)), [0] * 500, config)
    rows = [set(parts[s][0]) for s in ("train", "importance", "eval")]
    assert sum(map(len, rows)) == 500 and set().union(*rows) == set(range(500))
    assert (len(rows[1]), len(rows[2])) == (32, 60)
    assert parts == split_pool(list(range(500)), [0] * 500, config)
    assert task.data_fingerprint("eval") != task.data_fingerprint("importance")
    assert task.split_sizes() == {"train": 96, "importance": 32, "eval": 60}


def test_digits_are_normalised_as_the_processor_would_for_a_grayscale_model(tmp_path):
    """At image_size 8 (no resizing), a 1-channel model's pixels are (round(v * 255 / 16) / 255 - mean) / std."""
    from sklearn.datasets import load_digits

    from headprune.tasks.vision.task import load_vision_task

    cfg = vision_cfg(tmp_path, "model.config.image_size=8", "model.config.patch_size=2", "model.config.num_channels=1")
    task = load_vision_task(cfg)
    data = task.data.dataset("eval")
    assert data.pixels.shape == (60, 1, 8, 8)
    digits = load_digits()
    order = torch.randperm(len(digits.target), generator=torch.Generator().manual_seed(0))[:60].numpy()
    expected = (np.rint(digits.images[order] * 255 / 16) / 255 - 0.5) / 0.5
    assert np.abs(data.pixels[:, 0].numpy() - expected).max() < 1e-6
    assert data.labels.tolist() == digits.target[order].tolist()


def test_hub_rows_read_the_configured_columns_of_a_dataset():
    from datasets import Dataset
    from PIL import Image

    from headprune.tasks.vision.image_sources import hub_rows

    images = [Image.fromarray(np.full((6, 6), 40 * i, dtype=np.uint8)) for i in range(4)]
    dataset = Dataset.from_dict({"img": images, "fine_label": [3, 1, 0, 2]})
    got, labels = hub_rows(dataset, "img", "fine_label", "cifar split 'train'")
    assert labels == [3, 1, 0, 2] and [np.asarray(g).mean() for g in got] == [0, 40, 80, 120]
    with pytest.raises(ConfigError, match=r"no column \['image'\].*data.image_column"):
        hub_rows(dataset, "image", "fine_label", "cifar split 'train'")
    with pytest.raises(ConfigError, match="labels must be class ids"):
        hub_rows(Dataset.from_dict({"img": images, "fine_label": ["a", "b", "c", "d"]}), "img", "fine_label", "x")


def test_image_hub_holds_importance_out_of_train(tmp_path, monkeypatch):
    import datasets
    from datasets import Dataset
    from PIL import Image

    from headprune.tasks.vision import image_sources as sources
    from headprune.tasks.vision.config import ImageDataConfig

    def fake(path, name=None, split=None):
        size = {"train": 50, "test": 20}[split]
        return Dataset.from_dict({"image": [Image.new("L", (4, 4), i) for i in range(size)], "label": [i % 10 for i in range(size)]})

    monkeypatch.setattr(datasets, "load_dataset", fake)
    cfg = compose_cfg(tmp_path, ["experiment=ablate", "model=tiny_vit", "data=image_hub", "data.importance_size=10"])
    parts = sources.hub_images(ImageDataConfig.from_cfg(cfg.data))
    assert {s: len(parts[s][0]) for s in parts} == {"train": 40, "importance": 10, "eval": 20}
    shades = lambda split: {img.getpixel((0, 0)) for img in parts[split][0]}  # noqa: E731
    assert not shades("train") & shades("importance") and len(shades("train") | shades("importance")) == 50


def write_folder(root, bad: bool = False):
    from PIL import Image

    for label in ("cat", "dog"):
        (root / label).mkdir(parents=True)
        for i in range(12):
            Image.new("RGB", (10, 10), (20 * i, 100 if label == "cat" else 200, 0)).save(root / label / f"{i}.png")
    if bad:
        (root / "dog" / "broken.png").write_bytes(b"not a png")
    return root


def test_image_folder_source(tmp_path):
    from headprune.tasks.vision.task import load_vision_task

    root = write_folder(tmp_path / "images")
    cfg = vision_cfg(
        tmp_path, "data.source=folder", f"data.dir={root}", "data.eval_size=6", "data.importance_size=4", "data.limit_train=null"
    )
    task = load_vision_task(cfg)
    assert task.split_sizes() == {"train": 14, "importance": 4, "eval": 6}
    assert set(task.data.dataset("train").labels.tolist()) == {0, 1}


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["prune.split=test"], r"unknown split 'test'; choose from \['train', 'importance', 'eval'\]"),
        (["model.config.image_size=18"], r"image_size=18 is not a whole number of patch_size=4 patches"),
        (["data.source=folder", "data.dir=BAD"], r"broken.png is not a readable image"),
        (["data.source=pictures"], r"data.source='pictures' is not an image source"),
        (["data.importance_size=0"], "importance subset empty"),
        (["data=image_hub", "+data.hub_splits.valid=validation"], r"unknown keys: \['valid'\]"),
        (["data=nli_synthetic"], "does not fit data"),
    ],
)
def test_bad_inputs_are_config_errors(tmp_path, overrides, message):
    from headprune.validation import validate

    root = write_folder(tmp_path / "images", bad=True)
    base = ["model=tiny_vit", "logger=none"] if overrides[0].startswith("data=") else VISION
    cfg = compose_cfg(tmp_path, ["experiment=prune", *base, *[o.replace("BAD", str(root)) for o in overrides]])
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


@pytest.mark.parametrize("family", ["vit", "deit"])
def test_onnx_export_of_a_pruned_vit_equals_the_masked_model(family, tmp_path):
    import tiny_encoders
    from tiny_encoders import image_batch

    from headprune.core.pruning import prune_heads
    from headprune.export import export_model
    from headprune.export.verify import check_exports, reference_logits

    model = getattr(tiny_encoders, f"tiny_{family}")()
    removed = {"enc_self": {0: [1, 2], 1: [0, 1, 2, 3], 2: [3]}}  # uneven, layer 1 emptied
    gates = HeadGates(model)
    mask = gates.ones()
    for layer, heads in removed["enc_self"].items():
        mask["enc_self"][layer, heads] = 0.0
    batches = [{"pixel_values": image_batch(seed, batch)["pixel_values"]} for seed, batch in ((0, 4), (1, 7))]
    with gates.masked(mask):
        reference = reference_logits(model, batches)
    gates.remove()
    pruned = copy.deepcopy(model)
    prune_heads(pruned, removed)
    HeadGates(pruned).remove()
    exported = export_model("onnx", pruned, None, tmp_path, batches[0])
    report = check_exports([(exported["job"], batches, reference, None)])[0]
    assert report["headprune_importable"] is False and report["outputs_match"], report


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny ViT fine-tuned on the digits by experiment=vit_finetune: (run dir, metrics)."""
    from headprune.tasks.vision.task import finetune
    from headprune.validation import validate

    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("vit_finetune")
    cfg = compose_cfg(
        out,
        [
            "experiment=vit_finetune",
            "logger=none",
            "trainer.max_epochs=6",
            "trainer.enable_progress_bar=false",
            "+trainer.enable_model_summary=false",
        ],
    )
    validate(cfg)
    return out, finetune(cfg)


@pytest.mark.slow
def test_finetune_learns_the_digits(trained):
    """Six epochs over 1,287 training digits: eval accuracy far above the 10% of chance."""
    out, metrics = trained
    assert metrics["eval/accuracy_exact"] > 50.0 and metrics["eval/n"] == 360
    assert {"config.json", "model.safetensors", "preprocessor_config.json"} <= {p.name for p in (out / "model").iterdir()}
    assert json.loads((out / "results.json").read_text())["results"]["eval/accuracy_exact"] == metrics["eval/accuracy_exact"]


@pytest.mark.slow
def test_study_runs_unchanged_on_the_trained_vit(trained, tmp_path):
    from experiment_helpers import results

    from headprune.experiments import study
    from headprune.validation import validate

    model_dir = trained[0] / "model"
    over = [
        "experiment=study",
        "model=tiny_vit",
        "data=image_digits",
        "logger=none",
        "study.train=false",
        f"model.pretrained={model_dir}",
        "study.n_samples=50",
        "prune.step=0.5",
        "data.limit_eval=120",
        "speed.batch_sizes=[2]",
        "speed.examples=4",
        "speed.repeats=1",
        "speed.warmup=1",
    ]
    cfg = compose_cfg(tmp_path, over)
    with open_dict(cfg):
        cfg.trainer.enable_progress_bar = False
    validate(cfg)
    study.run(cfg)
    payload = results(tmp_path)
    res = payload["results"]
    assert {"ablate", "keep_one", "prune", "speed", "scores"} <= set(res) and payload["inputs"]["data"] == "image_digits"
    assert set(res["prune"]["orders"]) == {"importance", "ablation", "entropy", "random"}
    assert len(res["ablate"]["splits"]["eval"]["rows"]) == 16
    assert res["speed"]["score_check"]["masked"] == pytest.approx(res["speed"]["score_check"]["pruned"])

    from headprune.experiments import export

    out = tmp_path / "export"
    over = ["experiment=export", *over[1:4], f"model.pretrained={model_dir}", "data.limit_eval=120"]
    cfg = compose_cfg(out, [*over, f"export.mask_file={tmp_path / 'results.json'}", "export.quantize=int8", "speed.batch_sizes=[8]"])
    validate(cfg)
    export.run(cfg)
    check = results(out)["results"]["check"]
    assert check["outputs_match"] and check["headprune_importable"] is False
    described = json.loads((out / "export" / "onnx" / "headprune_export.json").read_text())
    assert described["task"] == "image-classification" and described["image_inputs"]["size"] == {"height": 16, "width": 16}


def test_a_model_dir_whose_processor_makes_other_sizes_is_a_config_error(tmp_path):
    from tiny_encoders import tiny_vit
    from transformers import ViTImageProcessorPil

    from headprune.core.saving import save_pruned
    from headprune.validation import validate

    model_dir = tmp_path / "model"
    save_pruned(tiny_vit(), model_dir, tokenizer=ViTImageProcessorPil(size={"height": 8, "width": 8}))
    cfg = compose_cfg(tmp_path, ["experiment=prune", *VISION, f"model.pretrained={model_dir}", "model.num_labels=3"])
    with pytest.raises(ConfigError, match=r"preprocessor_config.json makes 8x8 images, but the model .* takes 16x16"):
        validate(cfg)


def test_tiny_deit_takes_the_protocol_with_its_distillation_token(tmp_path):
    from headprune.tasks.registry import load_task

    task = load_task(vision_cfg(tmp_path, "model=tiny_deit", "data.eval_size=24"))
    assert type(task.model).__name__ == "DeiTForImageClassification"
    assert image_tokens(task.model) == (16 // 4) ** 2 + 2  # patches + CLS + distillation
    masks = masks_of(task.gates)
    for batched, mask in zip(task.evaluate_many(masks), masks):
        logits = masked_logits(task, mask)
        top2 = logits.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > TOLERANCE * logits.abs().max()
        single = task.evaluate(mask)
        agree = torch.tensor(batched.per_example["correct"]) == torch.tensor(single.per_example["correct"])
        assert bool(agree[clear].all())


def test_a_folder_names_the_classes_of_the_saved_model_and_of_its_onnx_export(tmp_path, capsys, monkeypatch):
    """experiment=vit_finetune on class folders (the command line): the saved config holds the folders' classes, and so
    do the ONNX export's config.json and description."""
    from cli_runs import headprune
    from PIL import Image

    from headprune.core.saving import load_pruned
    from headprune.export import export_model
    from headprune.tasks.vision.processor import build_processor

    names = ["cat", "dog", "owl"]
    root = tmp_path / "images"
    for index, name in enumerate(names):
        (root / name).mkdir(parents=True)
        for i in range(8):
            Image.new("RGB", (10, 10), (25 * i, 80 * index, 0)).save(root / name / f"{i}.png")
    run = tmp_path / "run"
    status, err = headprune(
        capsys,
        monkeypatch,
        tmp_path,
        run,
        "experiment=vit_finetune",
        "logger=none",
        "device=cpu",
        "data.source=folder",
        f"data.dir={root}",
        "data.eval_size=6",
        "data.importance_size=3",
        "trainer.max_epochs=1",
        "trainer.enable_progress_bar=false",
    )
    assert status == 0, err[-2000:]
    saved = json.loads((run / "model" / "config.json").read_text())
    assert saved["id2label"] == {"0": "cat", "1": "dog", "2": "owl"} and saved["label2id"] == {"cat": 0, "dog": 1, "owl": 2}
    model = load_pruned(run / "model").eval()
    assert model.config.num_labels == 3
    processor = build_processor(compose_cfg(tmp_path, ["model=tiny_vit", f"model.pretrained={run / 'model'}"]).model, model)
    out = tmp_path / "onnx"
    export_model("onnx", model, processor, out, {"pixel_values": torch.zeros(2, 3, 16, 16)})
    exported = json.loads((out / "config.json").read_text())
    assert exported["id2label"] == saved["id2label"]
    assert json.loads((out / "headprune_export.json").read_text())["labels"] == saved["id2label"]


def test_classes_come_from_the_source(tmp_path):
    """A folder's subfolders and the ten digits name the head's classes; a hub dataset takes model.num_labels."""
    from headprune.tasks.vision.task import label_settings

    root = write_folder(tmp_path / "images")
    folder = label_settings(vision_cfg(tmp_path, "data.source=folder", f"data.dir={root}"))
    assert folder == {"num_labels": 2, "id2label": {0: "cat", 1: "dog"}, "label2id": {"cat": 0, "dog": 1}}
    digits = label_settings(vision_cfg(tmp_path))
    assert digits["num_labels"] == 10 and digits["id2label"][7] == "7"
    hub = compose_cfg(tmp_path, ["experiment=ablate", "model=tiny_vit", "data=image_hub", "model.num_labels=5"])
    assert label_settings(hub) == {"num_labels": 5}


def test_every_class_in_train_and_eval_passes_the_folder_check(tmp_path):
    """The check's split is the data module's: a folder it passes gives every class training and evaluation images."""
    from headprune.tasks.vision.task import load_vision_task
    from headprune.validation import validate

    root = write_folder(tmp_path / "images")
    cfg = vision_cfg(tmp_path, "data.source=folder", f"data.dir={root}", "data.eval_size=6", "data.importance_size=4")
    validate(cfg)
    task = load_vision_task(cfg)
    for split in ("train", "eval"):
        assert set(task.data.dataset(split).labels.tolist()) == {0, 1}


@pytest.mark.parametrize("recover", ["finetune", "reconstruct+finetune"])
def test_a_vit_prune_run_fine_tunes_beside_its_control_and_records_the_images_trained_on(tmp_path, capsys, monkeypatch, recover):
    """The command line: a pruned ViT fine-tuned (distilled from its control trained first, in bfloat16) records its
    rounds in images, and every point's fine-tune ran."""
    from cli_runs import headprune

    run = tmp_path / "run"
    status, err = headprune(
        capsys,
        monkeypatch,
        tmp_path,
        run,
        "experiment=prune",
        *VISION,
        "prune.fractions=[0.25]",
        f"prune.recover={recover}",
        "prune.control=true",
        "prune.finetune.teacher=control",
        "prune.finetune.precision=bf16-mixed",
        "prune.finetune.max_steps=2",
        "prune.finetune.examples=64",
    )
    assert status == 0, err[-2000:]
    results = json.loads((run / "results.json").read_text())["results"]
    assert results["finetune"]["rounds"][0]["examples"] == 64
    tuned = [p for p in results["points"] if "finetune" in p["recovery"]]
    assert len(tuned) == 2 and all(p["finetune_losses"] for p in tuned)  # the control and the pruned point
