"""What every experiment shares: the task from the config, checks, run directory, results, W&B."""
from __future__ import annotations

import os
import time
from contextlib import contextmanager
from pathlib import Path

import torch
from omegaconf import OmegaConf

from headprune.results import model_fingerprint, results_payload, texts_fingerprint, write_json_atomic

# ---- the task ---------------------------------------------------------------------------------


def task_kind(cfg) -> str:
    """``nli`` for a classifier model, ``mt`` for a seq2seq model (checked against the data config)."""
    kind = {"classifier": "nli", "seq2seq": "mt"}.get(cfg.model.get("kind"))
    if kind is None:
        raise ValueError(f"model.kind must be classifier (NLI) or seq2seq (MT), got {cfg.model.get('kind')!r}")
    if cfg.get("data") is None:
        raise ValueError("no data chosen: add data=nli_synthetic|nli_local|nli_hub (NLI) or data=mt_synthetic|mt_multi30k|... (MT)")
    data_is_mt = cfg.data.get("kind") == "translation"
    if data_is_mt != (kind == "mt"):
        raise ValueError(f"model {cfg.model.get('name')} ({cfg.model.kind}) does not fit data {cfg.data.get('name')}: "
                         "NLI needs a classifier model, MT a seq2seq model")
    return kind


def device_of(cfg) -> torch.device:
    """``device=auto`` (default): CUDA when available, else CPU."""
    name = str(cfg.get("device") or "auto")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(name)


def load_task(cfg):
    """The NLI or MT task (model with gates + data) that the config describes, in eval mode on its device."""
    kind = task_kind(cfg)
    if kind == "nli":
        from headprune.tasks.nli import load_nli_task

        task = load_nli_task(cfg)
    else:
        from headprune.tasks.mt import load_translation_task

        _, task = load_translation_task(cfg)
    task.to(device_of(cfg))
    task.model.eval()
    return task


def selection_split(task, name: str | None = None) -> str:
    """The held-out split for choices (appendix A): MT ``heldout`` (valid), NLI the held-out training subset."""
    if name:
        return str(name)
    return "heldout" if getattr(task, "metric", "") == "bleu" else "importance"


def split_size(task, split: str) -> int:
    """Number of examples of a split (0 when the task has no such split; unreadable data files raise)."""
    data = task.data
    if hasattr(data, "references"):
        from headprune.data.translation import split_of

        try:
            name = split_of(data.cfg, split)
        except ValueError:
            return 0
        return len(data.references(name))
    try:
        return len(data.dataset(split))
    except KeyError:
        return 0


def check_split(task, split: str, what: str = "evaluation") -> None:
    """A clear error when an evaluation split is empty or missing, before any work."""
    if split_size(task, split) == 0:
        raise ValueError(f"the {what} split {split!r} is empty or missing: nothing to evaluate "
                         "(check data.limit_eval / data.limits and the data files)")


def data_fingerprint(task, split: str) -> str:
    """A hash of the split's texts (NLI premise+hypothesis, MT references)."""
    data = task.data
    if hasattr(data, "references"):
        from headprune.data.translation import split_of

        return texts_fingerprint(data.references(split_of(data.cfg, split)))
    texts = getattr(data.dataset(split), "texts", {}) or {}
    pairs = [f"{p}\t{h}" for p, h in zip(texts.get("premise", []), texts.get("hypothesis", []))]
    return texts_fingerprint(pairs) if pairs else texts_fingerprint(map(str, data.dataset(split).labels))


def evaluate_many(task, masks: list, split: str, desc: str = "", chunk: int = 36, progress: bool = True) -> list:
    """EvalResults of many masks through the task's batched ``evaluate_many``, with a progress bar."""
    from tqdm.auto import tqdm

    results = []
    n = max(split_size(task, split), 1)
    # the bar counts masks; it moves after every data batch (a chunk of masks over n examples)
    with tqdm(total=len(masks), desc=desc or f"evaluate {split}", unit="mask", disable=not progress, leave=False,
              bar_format="{l_bar}{bar}| {n:.1f}/{total} masks [{elapsed}<{remaining}]") as bar:
        for start in range(0, len(masks), chunk):
            todo, done = masks[start:start + chunk], bar.n
            part = task.evaluate_many(todo, split=split, on_batch=lambda examples: bar.update(len(todo) * examples / n))
            results.extend(part)
            bar.update(done + len(part) - bar.n)  # exact count at the chunk's end
    return results


def stage_progress(stages: list[str]):
    """A bar over the stages of a study."""
    from tqdm.auto import tqdm

    return tqdm(stages, desc="study", leave=True)


# ---- masks ------------------------------------------------------------------------------------


def mask_to_json(mask: dict) -> dict:
    return {g: m.detach().cpu().int().tolist() for g, m in mask.items()}


def mask_from_json(data: dict) -> dict:
    return {g: torch.tensor(v, dtype=torch.float32) for g, v in data.items()}


def tensor_dict(values: dict) -> dict:
    return {g: (v.detach().cpu().tolist() if hasattr(v, "detach") else v) for g, v in values.items()}


# ---- run directory, results and W&B ------------------------------------------------------------


def output_dir(cfg) -> Path:
    out = Path(cfg.paths.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    return out


def fingerprints(task, split: str) -> dict:
    return {"model": model_fingerprint(task.model), "data": data_fingerprint(task, split)}


def write_results(cfg, kind: str, numbers: dict, task=None, split: str = "eval", inputs: dict | None = None,
                  figures: list | None = None, path: Path | None = None) -> Path:
    """results.json (schema_version, inputs, config, fingerprints, results, figures), written atomically."""
    prints = fingerprints(task, split) if task is not None else {}
    payload = results_payload(kind, OmegaConf.to_container(cfg, resolve=True), numbers, **prints)
    payload["inputs"] = {"task": task_kind(cfg), "model": cfg.model.get("name"), "pretrained": cfg.model.get("pretrained"),
                         "data": cfg.data.get("name"), "split": split, **(inputs or {})}
    payload["figures"] = [Path(f).name for f in figures or []]
    payload["complete"] = True
    return write_json_atomic(path or output_dir(cfg) / "results.json", payload)


def flat_numbers(numbers: dict, prefix: str = "") -> dict:
    """Scalars of a nested dict as {"a/b": value} (lists and matrices left out)."""
    out = {}
    for key, value in numbers.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat_numbers(value, name + "/"))
        elif isinstance(value, (int, float, bool)):
            out[name] = value
    return out


def log_run(cfg, kind: str, numbers: dict, tables: dict | None = None, figures: list | None = None) -> None:
    """Send the run's numbers, tables and figures to the configured logger (W&B offline by default, or CSV)."""
    logger = cfg.get("logger") or {}
    mode = logger.get("kind", "none")
    tables = tables or {}
    if mode == "csv":
        import csv

        for name, (columns, rows) in tables.items():
            with open(output_dir(cfg) / f"{name}.csv", "w", newline="") as handle:
                writer = csv.writer(handle)
                writer.writerow(columns)
                writer.writerows(rows)
        return
    if mode != "wandb":
        return
    import wandb

    os.environ.setdefault("WANDB_MODE", str(logger.get("mode", "offline")))
    os.environ.setdefault("WANDB_SILENT", "true")
    run = wandb.init(project=logger.get("project", "headprune"), entity=logger.get("entity"), mode=logger.get("mode", "offline"),
                     dir=str(output_dir(cfg)), job_type=kind, tags=list(logger.get("tags") or []), reinit="finish_previous",
                     config=OmegaConf.to_container(cfg, resolve=True))
    try:
        run.summary.update(flat_numbers(numbers))
        payload = {f"table/{name}": wandb.Table(columns=list(columns), data=[list(r) for r in rows]) for name, (columns, rows) in tables.items()}
        payload.update({f"figure/{Path(f).stem}": wandb.Image(str(f)) for f in figures or []})
        if payload:
            run.log(payload)
    finally:
        wandb.finish()


@contextmanager
def timed(store: dict, key: str):
    start = time.perf_counter()
    try:
        yield
    finally:
        store[key] = time.perf_counter() - start


@contextmanager
def swapped_model(task, model, gates):
    """Evaluate ``task`` with another model (e.g. the physically pruned copy) in place of its own."""
    own_model, own_gates = task.model, task.gates
    task.model, task.gates = model, gates
    try:
        yield task
    finally:
        task.model, task.gates = own_model, own_gates
