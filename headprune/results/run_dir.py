"""An experiment's run directory: masks as JSON, results.json with its inputs and fingerprints."""

from pathlib import Path

import torch
from omegaconf import OmegaConf

from headprune.results.writer import model_fingerprint, output_dir, write_results_file


def mask_to_json(mask: dict) -> dict:
    return {g: m.detach().cpu().int().tolist() for g, m in mask.items()}


def mask_from_json(data: dict) -> dict:
    return {g: torch.tensor(v, dtype=torch.float32) for g, v in data.items()}


def tensor_dict(values: dict) -> dict:
    return {g: (v.detach().cpu().tolist() if hasattr(v, "detach") else v) for g, v in values.items()}


def write_results(cfg, kind: str, numbers: dict, task, split: str, inputs: dict | None = None, figures: list | None = None) -> Path:
    """results.json (schema_version, inputs, config, fingerprints, results, figures), written atomically."""
    described = {
        "task": task.name,
        "model": cfg.model.get("name"),
        "pretrained": cfg.model.get("pretrained"),
        "data": cfg.data.get("name"),
        "split": split,
        **(inputs or {}),
    }
    return write_results_file(
        output_dir(cfg) / "results.json",
        kind,
        OmegaConf.to_container(cfg, resolve=True),
        numbers,
        {"model": model_fingerprint(task.model), "data": task.data_fingerprint(split)},
        inputs=described,
        figures=[Path(f).name for f in figures or []],
        complete=True,
    )
