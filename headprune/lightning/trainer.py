"""Training plumbing shared by the tasks: trainer, fit-and-save."""

import time
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import ModelCheckpoint
from omegaconf import OmegaConf

from headprune.core.checks import ConfigError
from headprune.lightning.loggers import build_logger, finish_wandb
from headprune.results.writer import model_fingerprint, output_dir, write_results_file


def build_trainer(cfg, callbacks=(), logger=None) -> L.Trainer:
    """A Trainer from ``cfg.trainer`` with per-epoch checkpoints in ``<output_dir>/checkpoints``."""
    ckpt_cfg = cfg.callbacks.checkpoint  # conf/callbacks/default.yaml
    checkpoint = ModelCheckpoint(
        dirpath=str(output_dir(cfg) / "checkpoints"),
        filename="epoch{epoch:03d}-step{step}",
        auto_insert_metric_name=False,
        save_last=True,
        every_n_epochs=ckpt_cfg.every_n_epochs if not ckpt_cfg.every_n_train_steps else None,
        every_n_train_steps=ckpt_cfg.every_n_train_steps,
        save_top_k=ckpt_cfg.save_top_k,
        monitor=ckpt_cfg.monitor,
    )
    return L.Trainer(
        **OmegaConf.to_container(cfg.trainer, resolve=True),
        default_root_dir=str(output_dir(cfg)),
        logger=build_logger(cfg) if logger is None else logger,
        callbacks=[
            checkpoint,
            *(instantiate(spec) for name, spec in (cfg.get("callbacks") or {}).items() if name != "checkpoint" and spec is not None),
            *callbacks,
        ],
    )


def fit(cfg, module, datamodule, callbacks=()) -> dict:
    """Train ``module`` on ``datamodule``, validate, save the HF model to <output_dir>/model, write results.json."""
    L.seed_everything(cfg.seed, workers=True)
    trainer = build_trainer(cfg, callbacks=callbacks)
    resume = cfg.get("ckpt_path")  # ckpt_path=last: this run directory's last.ckpt (when it exists)
    if resume == "last":
        last = output_dir(cfg) / "checkpoints" / "last.ckpt"
        resume = str(last) if last.exists() else None
    elif resume and not Path(resume).exists():
        raise FileNotFoundError(f"ckpt_path={resume} does not exist; give a checkpoint file or `last`")
    start = time.perf_counter()
    module.train()  # HF models load in eval mode, and Lightning keeps the mode it is given: dropout on for fitting
    trainer.fit(module, datamodule=datamodule, ckpt_path=resume)
    train_seconds = time.perf_counter() - start
    final = trainer.validate(module, datamodule=datamodule, verbose=False)
    metrics = {k: float(v) for k, v in (final[0] if final else {}).items()}
    metrics.update(train_seconds=train_seconds, epochs=trainer.current_epoch, global_step=trainer.global_step)
    if trainer.is_global_zero:
        model_dir = output_dir(cfg) / "model"
        module.save_hf(model_dir)
        write_results_file(
            output_dir(cfg) / "results.json",
            str(cfg.experiment_name),
            OmegaConf.to_container(cfg, resolve=True),
            metrics,
            {"model": model_fingerprint(module.model)},
            model_dir=str(model_dir),
        )
    finish_wandb()
    return metrics


def read_training_checkpoint(path) -> dict:
    """A Lightning checkpoint's contents, or a ConfigError naming the file (missing, truncated or not a checkpoint)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except FileNotFoundError:
        raise ConfigError(f"checkpoint {path} does not exist: give a .ckpt file a training run wrote (<run>/checkpoints/)") from None
    except Exception as err:  # noqa: BLE001 - torch raises RuntimeError, zip, pickle or EOF errors for a damaged file
        raise ConfigError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}): the file is damaged or truncated; "
            "use another checkpoint of the run, or train again"
        ) from None
