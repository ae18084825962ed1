"""The one logging path of training and experiments: the configured Lightning logger (W&B offline by default, CSV, none)."""

import csv
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from headprune.results.writer import output_dir

LOGGER_KINDS = ("wandb", "csv", "none")


def build_logger(cfg, job_type: str | None = None):
    """The configured Lightning logger: W&B, CSV, or none (False)."""
    kind = cfg.logger.kind if cfg.get("logger") else "none"  # one of LOGGER_KINDS (the logger.kind setting's rule)
    if kind == "none":
        return False
    out = output_dir(cfg)
    if kind == "csv":
        from lightning.pytorch.loggers import CSVLogger

        return CSVLogger(save_dir=str(out), name="csv")
    from lightning.pytorch.loggers import WandbLogger

    os.environ.setdefault("WANDB_MODE", str(cfg.logger.mode))
    os.environ.setdefault("WANDB_SILENT", "true")
    return WandbLogger(
        project=cfg.logger.project,
        entity=cfg.logger.get("entity"),
        save_dir=str(out),
        mode=cfg.logger.mode,
        tags=list(cfg.logger.tags),
        config=OmegaConf.to_container(cfg, resolve=True),
        job_type=job_type,
    )


def flat_numbers(numbers: dict, prefix: str = "") -> dict:
    """Scalars of a nested dict as {"a/b": value} (lists and matrices left out)."""
    out = {}
    for key, value in numbers.items():
        if isinstance(value, dict):
            out.update(flat_numbers(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float, bool)):
            out[f"{prefix}{key}"] = value
    return out


def log_run(cfg, kind: str, numbers: dict, tables: dict | None = None, figures: list | None = None) -> None:
    """An experiment's scalars, tables {name: (columns, rows)} and figures to the configured logger."""
    logger = build_logger(cfg, job_type=kind)
    if not logger:
        return
    from lightning.pytorch.loggers import CSVLogger

    tables = tables or {}
    logger.log_metrics(flat_numbers(numbers))
    if isinstance(logger, CSVLogger):
        for name, (columns, rows) in tables.items():
            with open(output_dir(cfg) / f"{name}.csv", "w", newline="") as handle:
                csv.writer(handle).writerows([list(columns), *rows])
    else:
        for name, (columns, rows) in tables.items():
            logger.log_table(f"table/{name}", columns=list(columns), data=[list(r) for r in rows])
        for figure in figures or []:
            logger.log_image(f"figure/{Path(figure).stem}", images=[str(figure)])
    logger.finalize("success")
    finish_wandb()


def finish_wandb() -> None:
    """Close the W&B run so that multirun jobs and later experiments do not share one."""
    wandb = sys.modules.get("wandb")  # never import wandb just to close it (logger=csv|none)
    if wandb is not None and wandb.run is not None:
        wandb.finish()
