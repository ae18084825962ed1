"""An interrupted fine-tune resumes from its last checkpoint and ends where an uninterrupted one ends (weights, history)."""

from __future__ import annotations

import copy

import lightning as L
import pytest
import torch
from test_llm_recovery import text_batches
from tiny_llms import tiny_llama

from headprune.lightning.finetune import finetune_recover

STEPS, EVERY = 7, 2


class Killed(RuntimeError):
    """What stops the process in these tests (a kill would give no chance to clean up either)."""


class Interrupt(L.Callback):
    """Stops the process's training (an exception, as a kill would) after ``step`` optimizer steps."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            raise Killed(f"stopped at step {self.step}")


def tune(model, teacher, folder, **extra):
    """Seven distilled, warmed-up and decayed steps over three batches (epochs wrap), checkpointed every two steps."""
    return finetune_recover(
        model,
        text_batches(n=3),
        teacher=teacher,
        distill_weight=0.5,
        max_steps=STEPS,
        lr=1e-2,
        warmup=0.3,
        decay=True,
        accelerator="cpu",
        checkpoints=folder,
        checkpoint_every=EVERY,
        **extra,
    )


@pytest.mark.parametrize("lora_rank", [None, 2])
def test_an_interrupted_fine_tune_resumes_to_the_same_weights(tmp_path, lora_rank):
    """Interrupted after step 5 (its last save at step 4), rerun on a fresh copy: the weights and step losses of one run straight through."""
    torch.manual_seed(0)
    base = tiny_llama()  # no dropout: the steps are deterministic
    teacher = copy.deepcopy(base).eval()
    straight, resumed = copy.deepcopy(base), copy.deepcopy(base)
    history = tune(straight, teacher, tmp_path / "straight" / "point", lora_rank=lora_rank)
    folder = tmp_path / "finetune_state" / "point"  # the layout of a run's resume folders
    with pytest.raises(Killed):
        tune(copy.deepcopy(base), teacher, folder, lora_rank=lora_rank, callbacks=[Interrupt(5)])
    assert (folder / "state.json").is_file()
    again = tune(resumed, teacher, folder, lora_rank=lora_rank)
    assert len(again) == len(history) == STEPS
    assert [h["loss"] for h in again] == pytest.approx([h["loss"] for h in history], rel=1e-4, abs=1e-6)
    ours = dict(straight.named_parameters())
    for name, value in resumed.named_parameters():
        scale = ours[name].abs().max().item() + 1e-6
        assert torch.allclose(value, ours[name], atol=1e-5 * scale, rtol=0), name
    assert not (tmp_path / "finetune_state").exists()  # a finished fine-tune leaves no checkpoint, nor an empty parent, behind


def test_a_checkpoint_of_another_fine_tune_is_not_resumed(tmp_path, capsys):
    """A rerun with another lr in the same folder trains from the start, and says so; another point's folder stays."""
    torch.manual_seed(0)
    base = tiny_llama()
    teacher = copy.deepcopy(base).eval()
    folder, other = tmp_path / "finetune_state" / "run", tmp_path / "finetune_state" / "other"
    other.mkdir(parents=True)  # another point's checkpoints, still to resume
    with pytest.raises(Killed):
        tune(copy.deepcopy(base), teacher, folder, callbacks=[Interrupt(3)])
    history = finetune_recover(
        copy.deepcopy(base), text_batches(n=3), teacher=teacher, distill_weight=0.5, max_steps=STEPS, lr=5e-3,
        accelerator="cpu", checkpoints=folder, checkpoint_every=EVERY,
    )  # fmt: skip
    assert len(history) == STEPS
    assert not folder.exists() and other.is_dir()
    assert "another fine-tune" in capsys.readouterr().out


def test_a_checkpoint_distilled_from_another_teacher_is_not_resumed(tmp_path, capsys):
    """The same fine-tune rerun with another teacher of the same shape (the control in place of the unpruned model)
    trains from the start: the teacher's weights are part of what a checkpoint was trained on."""
    torch.manual_seed(0)
    base = tiny_llama()
    teacher, control = copy.deepcopy(base).eval(), copy.deepcopy(base).eval()
    with torch.no_grad():
        next(control.parameters()).add_(1e-3)  # one weight moved: another model to distil from
    folder = tmp_path / "finetune_state" / "point"
    with pytest.raises(Killed):
        tune(copy.deepcopy(base), teacher, folder, callbacks=[Interrupt(3)])
    assert len(tune(copy.deepcopy(base), control, folder)) == STEPS
    said = capsys.readouterr().out
    assert "another fine-tune" in said and "resuming" not in said
