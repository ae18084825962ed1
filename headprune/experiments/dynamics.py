"""experiment=dynamics: importance and pruning curves over saved checkpoints (a run's per-epoch ckpt_dir, or listed models/revisions)."""

from pathlib import Path

from omegaconf import OmegaConf
from tqdm.auto import tqdm

from headprune.checks.checkpoint_lists import check_checkpoint_models, check_epoch_checkpoints, epoch_checkpoints, ordered_checkpoints
from headprune.checks.shared_checks import check_reads, check_task, no_duplicates
from headprune.core.checks import ConfigError
from headprune.lightning.callbacks import take_snapshot, with_stability
from headprune.lightning.trainer import read_training_checkpoint
from headprune.models.sources import has_tokenizer, looks_like_path
from headprune.results.writer import write_results_file
from headprune.settings import listed as list_of
from headprune.tasks import registry
from headprune.viz.plots import importance_over_time, pruning_curves_by_epoch


def checkpoint_training_config(ckpt_dir: Path, cfg):
    """The training run's own Hydra config, with the model loaded from its saved HF directory."""
    run_dir = ckpt_dir.parent
    train_cfg = OmegaConf.load(run_dir / ".hydra" / "config.yaml")  # check_epoch_checkpoints told a missing one before work
    OmegaConf.set_struct(train_cfg, False)
    model_dir = run_dir / "model"
    if model_dir.exists():
        train_cfg.model.pretrained = str(model_dir)  # architecture and tokenizer; weights come from each checkpoint
        train_cfg.model.tokenizer = str(model_dir)
    train_cfg.paths = cfg.paths
    overrides = cfg.dynamics_overrides
    pairs = overrides.items() if hasattr(overrides, "items") else (item.split("=", 1) for item in list_of(overrides))
    for key, value in pairs:
        value = OmegaConf.from_dotlist([f"v={value}"]).v if isinstance(value, str) else value  # "300" -> 300, "[a,b]" -> a list
        OmegaConf.update(train_cfg, key, value, force_add=True)
    return train_cfg


def analyse_checkpoints(cfg) -> list[dict]:
    """A snapshot per epoch checkpoint, with the same settings as the live callback."""
    ckpt_dir = Path(cfg.ckpt_dir)
    task = registry.load_task(checkpoint_training_config(ckpt_dir, cfg))
    snapshots = []
    for epoch, step, path in tqdm(epoch_checkpoints(ckpt_dir), desc="checkpoints"):
        task.load_state_dict(read_training_checkpoint(path)["state_dict"])
        snapshots.append(take_snapshot(task, cfg.dynamics, epoch=epoch, step=step))
    return with_stability(snapshots)


def model_snapshot(cfg, entry: str, index: int, step: int) -> dict:
    """The snapshot of one listed checkpoint: the model read from ``entry`` (and its tokenizer, when the checkpoint holds one)."""
    one = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    one.model.pretrained = str(entry)
    local = looks_like_path(str(entry)) or Path(str(entry)).expanduser().exists()
    if not local or has_tokenizer(Path(str(entry)).expanduser()):
        one.model.tokenizer = str(entry)
    snap = take_snapshot(registry.load_task(one), cfg.dynamics, epoch=index, step=step)  # the task freed on return
    return {**snap, "checkpoint": str(entry), "label": f"step {step}"}


def analyse_models(cfg) -> list[dict]:
    """A snapshot per checkpoint (directory or hub name@revision), by the step its name tells (said where that reorders), else as given."""
    listed = [str(c) for c in cfg.checkpoints]
    ordered = ordered_checkpoints(listed)
    if [entry for _, entry in ordered] != listed:
        print(f"checkpoints taken by the step in their names: {', '.join(f'step {s} ({e})' for s, e in ordered)}", flush=True)
    return with_stability(
        [model_snapshot(cfg, entry, index, step) for index, (step, entry) in enumerate(tqdm(ordered, desc="checkpoints"))]
    )


def check(cfg) -> None:
    """One source of checkpoints, each checked before work (headprune.checks.checkpoint_lists), their task; dynamics.fractions once each."""
    check_reads(cfg)
    no_duplicates(cfg.dynamics.fractions, "dynamics.fractions")
    listed = [str(c) for c in list_of(cfg.checkpoints)]
    if bool(listed) == (cfg.get("ckpt_dir") is not None):
        raise ConfigError(
            "experiment=dynamics reads one of ckpt_dir=<training run>/checkpoints (a headprune training run's epochs) or "
            "'checkpoints=[<model dir or hub name@revision>,...]' (a pretraining run's checkpoints): "
            + ("both were given" if listed else "give one")
        )
    no_duplicates(listed, "checkpoints", "each checkpoint is one snapshot; remove the repeats")
    if listed and cfg.get("dynamics_overrides"):
        raise ConfigError(
            "dynamics_overrides changes the saved training config of a ckpt_dir run; with checkpoints=[...] set the "
            "settings directly (e.g. data.limits.eval=300) and drop dynamics_overrides"
        )
    if listed:
        ordered_checkpoints(listed)
        check_checkpoint_models(cfg, listed)
        check_task(cfg)
    elif not Path(str(cfg.ckpt_dir)).expanduser().is_dir():
        raise ConfigError(
            f"ckpt_dir={cfg.ckpt_dir} is not a directory: give a training run's checkpoints folder "
            "(e.g. ckpt_dir=outputs/mt_train/<date>/checkpoints)"
        )
    else:
        check_epoch_checkpoints(Path(str(cfg.ckpt_dir)).expanduser())


def run(cfg) -> dict:
    """Analyse the checkpoints, write dynamics.json and the figures, and print the per-epoch table."""
    out = Path(cfg.paths.output_dir)
    snapshots = analyse_models(cfg) if cfg.checkpoints else analyse_checkpoints(cfg)
    source = {"checkpoints": [s["checkpoint"] for s in snapshots]} if cfg.checkpoints else {"ckpt_dir": str(cfg.ckpt_dir)}
    write_results_file(
        out / "dynamics.json",
        "dynamics",
        OmegaConf.to_container(cfg, resolve=True),
        {"n_snapshots": len(snapshots)},
        source,
        source="checkpoints",
        snapshots=snapshots,
    )
    pruning_curves_by_epoch(snapshots, out / "dynamics_pruning_curves.png")
    importance_over_time(snapshots, out / "dynamics_importance.png")
    at = cfg.dynamics.report_fraction
    for snap in snapshots:
        index = min(range(len(snap["fractions"])), key=lambda i: abs(snap["fractions"][i] - at))
        label = snap.get("label") or f"epoch {snap['epoch'] + 1:3d}"
        print(
            f"{label}: unpruned {snap['unpruned']:.2f}  at {100 * snap['fractions'][index]:.0f}% pruned "
            f"{snap['scores'][index]:.2f}  prunable {100 * snap['prunable_fraction']:.0f}%"
        )
    return {"snapshots": snapshots}
