"""A Lightning callback for the DDP test: a digest of every parameter per rank at the end of training."""

import hashlib
from pathlib import Path

import lightning as L


class WeightsDigest(L.Callback):
    """Write a SHA-256 of every parameter to ``<dirpath>/rank<r>.txt`` at the end of training (DDP consistency check)."""

    def __init__(self, dirpath: str | None = None):
        self.dirpath = dirpath

    def on_train_end(self, trainer, pl_module) -> None:
        digest = hashlib.sha256()
        for name, tensor in sorted(pl_module.state_dict().items()):
            digest.update(name.encode())
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        out = Path(self.dirpath or Path(trainer.default_root_dir) / "weights_digest")
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{trainer.global_rank}.txt").write_text(f"{digest.hexdigest()} step={trainer.global_step}\n")
