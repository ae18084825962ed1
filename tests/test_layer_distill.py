"""Layer-wise hidden-state distillation of the fine-tune recovery, and the tokens per second it records."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from cli_runs import TINY_LM_PRUNE, headprune
from conftest import seq2seq_batch, tiny_marian
from experiment_helpers import NLI
from tiny_llms import lm_batch, tiny_llama

from headprune.core.hidden.pruning import keep_channels
from headprune.core.layer.removal import remove_layers
from headprune.lightning.finetune import RecoveryModule, finetune_recover
from headprune.lightning.layer_distill import layer_distillation_loss, layer_targets, normalised_mse
from headprune.stages.finetune_runs import finetune_record


def _layer_loss(student, teacher, batch) -> torch.Tensor:
    module = RecoveryModule(student, teacher=teacher, distill_weight=0.0, layer_distill=1.0)
    with torch.no_grad():
        return module.losses(batch)[2]


def test_the_layer_loss_is_zero_for_the_teacher_itself_and_positive_after_pruning():
    teacher, batch = tiny_llama(layers=3), lm_batch()
    student = copy.deepcopy(teacher)
    assert float(_layer_loss(student, teacher, batch)) == pytest.approx(0.0, abs=1e-7)
    remove_layers(student, {"dec_layer": [1]})
    assert float(_layer_loss(student, teacher, batch)) > 1e-3


def test_the_per_token_layer_loss_is_each_real_tokens_relative_error_averaged():
    generator = torch.Generator().manual_seed(0)
    teacher = torch.randn(2, 5, 8, generator=generator)
    teacher[0, 0] *= 1000.0  # one token of massive activations
    student = teacher + 0.1 * torch.randn(2, 5, 8, generator=generator)
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[1, 3:] = False
    by_token = [float((student[b, t] - teacher[b, t]).pow(2).sum() / teacher[b, t].pow(2).sum()) for b, t in valid.nonzero().tolist()]
    assert float(normalised_mse(student, teacher, valid, per_token=True)) == pytest.approx(sum(by_token) / len(by_token), rel=1e-5)
    pooled = float((student - teacher)[valid].pow(2).sum() / teacher[valid].pow(2).sum())
    assert float(normalised_mse(student, teacher, valid)) == pytest.approx(pooled, rel=1e-5)
    scaled = 0.9 * teacher  # a uniform relative error: both normalisers give (1 - 0.9)^2
    for per_token in (False, True):
        assert float(normalised_mse(scaled, teacher, valid, per_token)) == pytest.approx(0.01, rel=1e-4)


def test_a_layer_loss_other_than_batch_or_token_is_refused():
    with pytest.raises(ValueError, match="layer_loss is 'batch'"):
        RecoveryModule(tiny_llama(), teacher=tiny_llama(), layer_distill=1.0, layer_loss="layer")


def _layer_outputs(model, batch) -> list[torch.Tensor]:
    """Each layer's output hidden state (B, T, D), caught by forward hooks on the layers."""
    caught = []
    hooks = [
        layer.register_forward_hook(lambda _m, _i, out: caught.append(out[0] if isinstance(out, tuple) else out))
        for layer in model.model.layers
    ]
    try:
        with torch.no_grad():
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    finally:
        for hook in hooks:
            hook.remove()
    return caught


def _by_hand(student, teacher, batch, kept_layers: list[int], channels: list[int]) -> float:
    """Mean over the student's layers of sum |s - t|^2 / sum |t|^2 over real tokens, token by token (the last after the final norm)."""
    mine, theirs = _layer_outputs(student, batch), _layer_outputs(teacher, batch)
    mine[-1], theirs[-1] = student.model.norm(mine[-1]), teacher.model.norm(theirs[-1])  # the stacks' last outputs meet
    terms = []
    for position, original in enumerate(kept_layers):
        target = theirs[-1] if position == len(kept_layers) - 1 else theirs[original]
        error = scale = 0.0
        for row in range(batch["input_ids"].shape[0]):
            for token in range(batch["input_ids"].shape[1]):
                if batch["attention_mask"][row, token]:
                    wanted = target[row, token, channels]
                    error += float(((mine[position][row, token] - wanted) ** 2).sum())
                    scale += float((wanted**2).sum())
        terms.append(error / scale)
    return sum(terms) / len(terms)


@pytest.mark.parametrize(
    ("removed", "channels"),
    [([1], list(range(32))), ([3], list(range(32))), ([0, 2], list(range(32))), ([1], [c for c in range(32) if c % 4 != 1])],
    ids=["middle-layer", "last-layer", "two-layers", "layer-and-channels"],
)
def test_the_layer_loss_pairs_each_kept_layer_with_its_original_layer(removed, channels):
    teacher, batch = tiny_llama(layers=4), lm_batch(left_pad=True)
    student = copy.deepcopy(teacher)
    remove_layers(student, {"dec_layer": removed})
    if len(channels) < 32:
        keep_channels(student, channels)
        assert layer_targets(student, teacher).channels.tolist() == channels
    kept = [layer for layer in range(4) if layer not in removed]
    expected = _by_hand(student, teacher, batch, kept, channels)
    assert float(_layer_loss(student, teacher, batch)) == pytest.approx(expected, rel=1e-4)


def test_an_encoder_decoder_is_distilled_on_both_stacks():
    teacher, batch = tiny_marian(), seq2seq_batch()
    student = copy.deepcopy(teacher)
    remove_layers(student, {"dec_layer": [0]})
    forward = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
    forward["decoder_input_ids"] = teacher.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
    with torch.no_grad():
        mine, theirs = student(**forward), teacher(**forward)
    targets = layer_targets(student, teacher)
    both = float(layer_distillation_loss(mine, theirs, batch, targets))
    encoder = float(layer_distillation_loss({"encoder_hidden_states": mine.encoder_hidden_states}, theirs, batch, targets))
    decoder = float(layer_distillation_loss({"decoder_hidden_states": mine.decoder_hidden_states}, theirs, batch, targets))
    assert encoder == pytest.approx(0.0, abs=1e-7) and decoder > 0  # the encoder is intact, the decoder lost a layer
    layers = len(mine.encoder_hidden_states) - 1, len(mine.decoder_hidden_states) - 1
    assert both == pytest.approx(decoder * layers[1] / sum(layers), rel=1e-5)  # the mean over every layer of both stacks


def test_a_lora_fine_tune_with_layer_distillation_counts_its_real_tokens_and_time():
    teacher = tiny_llama(layers=3)
    student = copy.deepcopy(teacher)
    remove_layers(student, {"dec_layer": [1]})
    batches = [lm_batch(seed=s) for s in range(2)]
    history = finetune_recover(
        student, batches, teacher=teacher, distill_weight=0.5, layer_distill=1.0, max_steps=2, lr=1e-2, lora_rank=2, accelerator="cpu"
    )
    assert [h["tokens"] for h in history] == [int(b["attention_mask"].sum()) for b in batches]
    assert all(h["seconds"] > 0 and h["layer_distill"] > 0 for h in history)
    record = finetune_record(history)
    assert record["finetune_tokens"] == sum(h["tokens"] for h in history)
    assert record["finetune_tokens_per_s"] == pytest.approx(record["finetune_tokens"] / sum(h["seconds"] for h in history))


def _finetuned_points(run_dir) -> list[dict]:
    points = json.loads((run_dir / "results.json").read_text())["results"]["points"]
    return [p for p in points if p.get("recovery") == "finetune"]


@pytest.mark.parametrize(
    "overrides",
    [
        [*TINY_LM_PRUNE, "prune.unit=ffn", "prune.fractions=[0.25]"],
        [*TINY_LM_PRUNE, "prune.unit=ffn", "prune.fractions=[0.25]", "prune.finetune.layer_loss=token"],
        ["experiment=prune", *NLI, "logger=none", "prune.unit=layer", "prune.fractions=[0.5]", "prune.control=true"],
    ],
    ids=["llama-ffn", "llama-ffn-per-token", "bert-layer-and-control"],
)
def test_the_cli_fine_tune_with_layer_distillation_records_tokens_per_second(capsys, monkeypatch, tmp_path, overrides):
    extra = ["prune.recover=finetune", "prune.finetune.layer_distill=1.0", "prune.finetune.max_steps=2", "prune.finetune.progress=false"]
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "run", *overrides, *extra, "prune.save=none")
    assert status == 0, err
    points = _finetuned_points(tmp_path / "run")
    assert len(points) == (2 if "prune.control=true" in overrides else 1)
    for point in points:
        assert len(point["finetune_losses"]) == 2 and point["finetune_tokens"] > 0 and point["finetune_tokens_per_s"] > 0


@pytest.mark.parametrize("teacher", ["control", "unpruned"])
def test_the_points_distil_from_the_control_trained_first_or_from_the_unpruned_model(capsys, monkeypatch, tmp_path, teacher):
    """prune.finetune.teacher=control: the control is fine-tuned before the points, and the model it trained is the teacher of
    every point's fine-tune; =unpruned: the points' teacher is the unpruned model, and the control comes after them."""
    import headprune.stages.finetune_runs as finetune_runs
    import headprune.stages.pareto_measure as pareto_measure

    calls, original = [], finetune_runs.finetune_in_place

    def recorded(model, teacher_model, batches, finetune, logger, label, checkpoints=None):
        calls.append((label, model, teacher_model))
        return original(model, teacher_model, batches, finetune, logger, label, checkpoints)

    monkeypatch.setattr(finetune_runs, "finetune_in_place", recorded)
    monkeypatch.setattr(pareto_measure, "finetune_in_place", recorded)
    overrides = [*TINY_LM_PRUNE, "prune.unit=ffn", "prune.fractions=[0.25,0.5]", "prune.recover=finetune", "prune.control=true"]
    extra = ["prune.finetune.max_steps=2", "prune.finetune.progress=false", f"prune.finetune.teacher={teacher}", "prune.save=none"]
    status, err = headprune(capsys, monkeypatch, tmp_path, tmp_path / "run", *overrides, *extra)
    assert status == 0, err
    labels = [label for label, *_ in calls]
    control = next(model for label, model, _ in calls if label == "control")
    points = [source for label, _, source in calls if label != "control"]
    assert len(points) == 2 and labels.index("control") == (0 if teacher == "control" else 2)
    assert all((source is control) == (teacher == "control") for source in points)
    assert len(_finetuned_points(tmp_path / "run")) == 3
