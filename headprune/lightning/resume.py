"""Resumable fine-tunes: the training state saved every few steps, atomically, and where a rerun starts again."""

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path

import lightning as L
import torch

from headprune.results.writer import write_json_atomic

STATE = "state.json"  # {"step": the steps the checkpoint holds, "checkpoint": its file name, "fingerprint": what it trained on}


def weights_digest(model) -> str | None:
    """A SHA-1 of ``model``'s state (names and values): two teachers of one architecture tell apart; None for no model."""
    if model is None:
        return None
    digest = hashlib.sha1()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def resume_from(folder: Path | None, fingerprint: dict) -> tuple[Path | None, int]:
    """(the checkpoint a rerun resumes from, the optimizer steps it holds); (None, 0) when none fits ``fingerprint``."""
    if folder is None or not (folder / STATE).is_file():
        return None, 0
    try:
        state = json.loads((folder / STATE).read_text())
        checkpoint, step = folder / state["checkpoint"], int(state["step"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        print(f"[finetune] {folder}: unreadable resume state ({error}); training from the start", flush=True)
        return None, 0
    if state.get("fingerprint") != fingerprint or not checkpoint.is_file():
        print(f"[finetune] {folder}: its checkpoint is of another fine-tune or missing; training from the start", flush=True)
        return None, 0
    print(f"[finetune] resuming from step {step} ({checkpoint.name})", flush=True)
    return checkpoint, step


def forget(folder: Path | None) -> None:
    """Remove a finished fine-tune's checkpoints (they are only for resuming it), and their parent once it is empty."""
    if folder is None:
        return
    shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError):  # another point's checkpoints still there: the parent stays
        folder.parent.rmdir()


class SaveEvery(L.Callback):
    """Every ``every`` optimizer steps: the trainer's state to ``folder/step-N.ckpt``, then (the file whole) ``state.json`` naming it, then the older file removed."""

    def __init__(self, folder: Path, every: int, fingerprint: dict):
        self.folder, self.every, self.fingerprint = Path(folder), int(every), fingerprint

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.every or step >= trainer.max_steps:  # the last step needs no checkpoint: the run ends there
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"step-{step}.ckpt"
        partial = self.folder / f"{name}.partial"
        trainer.save_checkpoint(partial)
        os.replace(partial, self.folder / name)
        write_json_atomic(self.folder / STATE, {"step": step, "checkpoint": name, "fingerprint": self.fingerprint})
        for old in self.folder.glob("step-*.ckpt"):
            if old.name != name:
                old.unlink(missing_ok=True)
