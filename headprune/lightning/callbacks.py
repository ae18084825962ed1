"""Training dynamics of head importance (paper section 6): snapshots (importance + a pruning curve) and the callback taking them."""

from pathlib import Path

import lightning as L
import numpy as np
from lightning.pytorch.loggers import WandbLogger

from headprune.engine.verdict import prunable_fraction
from headprune.results.writer import write_results_file
from headprune.scoring.importance import importance_scores
from headprune.selection.greedy import check_fractions
from headprune.selection.uniform import layout_masks


def take_snapshot(task, settings, epoch: int | None = None, step: int | None = None) -> dict:
    """Importance of every head and the score at each fraction pruned greedily by it; ``settings`` holds the dynamics.* ones."""
    fractions = check_fractions(settings.fractions)
    fractions = fractions if 0.0 in fractions else [0.0, *fractions]
    model = task.model
    was_training = model.training
    try:
        scores = importance_scores(model, task.gates, task.importance_batches(), reduce=settings.reduce)
        masks = layout_masks(scores, task.gates.groups, fractions)
        results = task.evaluate_many(masks, split=settings.split)
    finally:
        model.train(was_training)
    curve = [float(r.score) for r in results]
    unpruned = curve[0]
    return {
        "epoch": epoch,
        "step": step,
        "metric": results[0].metric,
        "n_eval": results[0].n,
        "fractions": fractions,
        "scores": curve,
        "relative": [s / unpruned if unpruned else float("nan") for s in curve],
        "unpruned": unpruned,
        "prunable_fraction": prunable_fraction(fractions, curve, settings.tolerance, task.higher_is_better),
        "tolerance": settings.tolerance,
        "importance": {g: s.tolist() for g, s in scores.items()},
    }


def with_stability(history: list[dict]) -> list[dict]:
    """Add ``rank_stability`` (the Spearman rank correlation of its importance with the previous snapshot's; 0 if undefined) to each."""
    from scipy.stats import spearmanr

    flat = [np.concatenate([np.ravel(snap["importance"][g]) for g in sorted(snap["importance"])]) for snap in history]  # every head
    rho = [float(np.nan_to_num(spearmanr(before, after).statistic)) for before, after in zip(flat, flat[1:])]
    return [{**snap, "rank_stability": rho[i - 1] if i else None} for i, snap in enumerate(history)]


class HeadImportanceTracker(L.Callback):
    """Every N epochs (or steps), and at every checkpoint, snapshot importance and a pruning curve."""

    def __init__(
        self,
        fractions,
        split: str,
        reduce: str,
        tolerance: float,
        every_n_epochs: int | None = 1,
        every_n_steps: int | None = None,
        output_dir: str | None = None,
        on_checkpoint: bool = True,
    ):
        self.every_n_epochs, self.every_n_steps, self.on_checkpoint = every_n_epochs, every_n_steps, on_checkpoint
        self.fractions, self.split, self.reduce, self.tolerance = list(fractions), split, reduce, tolerance
        self.output_dir = output_dir
        self.history: list[dict] = []

    def _taken_at(self, step: int) -> bool:
        return any(s["step"] == step for s in self.history)

    def _snapshot(self, trainer: L.Trainer, pl_module) -> None:
        if trainer.sanity_checking or self._taken_at(trainer.global_step) or not trainer.is_global_zero:
            return
        self.history.append(take_snapshot(pl_module, self, epoch=trainer.current_epoch, step=trainer.global_step))
        self.history = with_stability(self.history)
        path = Path(self.output_dir or trainer.default_root_dir) / "dynamics.json"
        write_results_file(path, "dynamics", None, source="callback", snapshots=self.history)
        self._log(trainer, pl_module, self.history[-1])

    def on_validation_end(self, trainer, pl_module):
        """At the end of each training epoch's validation (before the epoch checkpoint is written)."""
        if trainer.sanity_checking or trainer.state.fn != "fit":
            return
        batches = trainer.num_training_batches  # at the epoch's end, not at a validation within it (val_check_interval)
        at_end = batches == float("inf") or trainer.fit_loop.epoch_loop.batch_progress.current.ready % max(int(batches), 1) == 0
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0 and at_end:
            self._snapshot(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module):
        """Runs without validation still get their epoch snapshot."""
        if self.every_n_epochs and (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self._snapshot(trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.every_n_steps and trainer.global_step % self.every_n_steps == 0:
            self._snapshot(trainer, pl_module)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint):
        """Every checkpoint carries a snapshot of its own weights (taken now if missing)."""
        if self.on_checkpoint and not self._taken_at(trainer.global_step):
            self._snapshot(trainer, pl_module)
        if self.state_key in checkpoint.get("callbacks", {}):
            checkpoint["callbacks"][self.state_key].update(self.state_dict())

    def state_dict(self) -> dict:
        return {"history": self.history}

    def load_state_dict(self, state_dict: dict) -> None:
        self.history = list(state_dict.get("history", []))

    def _log(self, trainer, pl_module, snap: dict) -> None:
        """Scalars to any logger; curve, table and heatmap images to W&B."""
        scalars = {"dynamics/unpruned": snap["unpruned"], "dynamics/prunable_fraction": snap["prunable_fraction"]}
        if snap.get("rank_stability") is not None:
            scalars["dynamics/rank_stability"] = snap["rank_stability"]
        for fraction, relative in zip(snap["fractions"], snap["relative"]):
            scalars[f"dynamics/relative@{fraction:.2f}"] = relative
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=trainer.global_step)
            if isinstance(logger, WandbLogger):
                _log_wandb(logger.experiment, snap, trainer.global_step)


def _log_wandb(run, snap: dict, step: int) -> None:
    import matplotlib.pyplot as plt
    import wandb

    from headprune.viz.plots import importance_heatmaps

    epoch = snap["epoch"]
    table = wandb.Table(
        columns=["fraction", "score", "relative"], data=[[f, s, r] for f, s, r in zip(snap["fractions"], snap["scores"], snap["relative"])]
    )
    figure = importance_heatmaps(snap["importance"], title=f"head importance, epoch {epoch}")
    run.log(
        {
            f"dynamics/pruning_curve_epoch{epoch}": wandb.plot.line(table, "fraction", "relative", title=f"pruning curve, epoch {epoch}"),
            "dynamics/importance": wandb.Image(figure),
            "trainer/global_step": step,
        }
    )
    plt.close(figure)
