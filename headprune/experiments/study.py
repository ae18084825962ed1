"""experiment=study: fine-tune (or load) once, then ablate, keep_one, prune (all orders) and speed.

The stages share the model, the data, the unmasked score and the importance/entropy scores. Each
stage writes ``stages/<name>.json`` when it completes; a rerun in the same run directory
(``hydra.run.dir=<that dir>``) skips every stage whose results are complete and whose settings
are unchanged. ``make demo`` runs this on the embedded MiniLM: fine-tuned on the local MNLI copy
when there is one, else on the synthetic NLI set (it says which).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from omegaconf import OmegaConf, open_dict

from headprune.experiments.ablate import ablation_figure, ablation_stage
from headprune.experiments.evaluation import check_split, selection_split, split_size
from headprune.experiments.keep_one import keep_one_stage
from headprune.experiments.orders import ORDERS
from headprune.experiments.prune import curves_of, fractions_of, order_settings, orders_of, prune_stage
from headprune.experiments.rundir import fingerprints, mask_from_json, tensor_dict, write_results
from headprune.experiments.speed import adaptive_settings, clock_of, speed_stage
from headprune.loggers import log_run
from headprune.ordering import check_fractions, check_groups, masks_for_fractions
from headprune.experiments.prune_speed import for_speed, pareto_stage
from headprune.plots import keep_one_bars, pareto_figure, pruning_curves, speed_bars
from headprune.render import ablation_rows, keep_one_rows, pareto_rows, prune_rows, speed_rows
from headprune.results import SCHEMA_VERSION, output_dir, read_json, write_json_atomic
from headprune.significance import correlation
from headprune.speed_verdict import is_inconclusive
from headprune.tasks import registry

STAGES = ("train", "scores", "ablate", "keep_one", "prune", "pareto", "speed")


def _plain(value):
    def default(o):
        return OmegaConf.to_container(o, resolve=True) if OmegaConf.is_config(o) else str(o)

    return json.loads(json.dumps(value, default=default))


def stage(out: Path, name: str, key, compute) -> dict:
    """Load ``stages/<name>.json`` when complete with the same settings, else compute and write it atomically."""
    path = out / "stages" / f"{name}.json"
    key = _plain(key)
    if path.exists():
        saved = read_json(path)
        if saved.get("complete") and saved.get("key") == key:
            print(f"[study] {name}: complete in {path}, skipped", flush=True)
            return saved["results"]
    numbers = compute()
    write_json_atomic(path, {"schema_version": SCHEMA_VERSION, "stage": name, "key": key, "complete": True, "results": numbers})
    return numbers


def choose_data(cfg) -> str:
    """Switch to the synthetic NLI set when the local MNLI copy is missing; returns a sentence saying which data is used."""
    data = cfg.data
    if data.get("source") == "local" and data.get("dir") and not Path(str(data.dir)).exists():
        fallback = str(cfg.study.fallback_data)
        from headprune.cli import config_dir

        conf = Path(config_dir()) / "data"
        try:
            from hydra import compose

            replacement = compose(config_name="config", overrides=[f"data={fallback}", "experiment=inspect"]).data
        except Exception:  # outside a Hydra app: merge the two files by hand
            extra = OmegaConf.load(conf / f"{fallback}.yaml")
            extra.pop("defaults", None)
            replacement = OmegaConf.merge(OmegaConf.load(conf / "nli_local.yaml"), extra)
        pristine = OmegaConf.load(conf / "nli_local.yaml")  # carry over what the study or the user changed (limits, sizes)
        for key in data:
            if key not in ("name", "source", "dir", "files") and key in pristine and key in replacement and data[key] != pristine[key]:
                replacement[key] = data[key]
        with open_dict(cfg):
            cfg.data = replacement
        return f"local MNLI not found at {data.dir}: using the synthetic NLI set (data={fallback})"
    return f"data={data.get('name')} ({data.get('source')})"


def train_stage(cfg, out: Path) -> str | None:
    """Train the task's model into <out>/train and point ``model.pretrained`` (and its tokenizer) at the result."""
    train_dir = out / "train"
    model_dir = train_dir / "model"
    if (train_dir / "results.json").exists() and model_dir.exists() and read_json(train_dir / "results.json").get("results"):
        print(f"[study] train: complete in {train_dir}, skipped", flush=True)
    else:
        sub = cfg.copy()
        with open_dict(sub):
            sub.paths.output_dir = str(train_dir)
            sub.experiment_name = "study_train"
            for key, value in (cfg.study.get("train_overrides") or {}).items():
                OmegaConf.update(sub, key, value, force_add=True)
        registry.train_task(sub)
    with open_dict(cfg):
        cfg.model.pretrained = str(model_dir)
        cfg.model.tokenizer = str(model_dir)  # the saved model dir holds its tokenizer
    return str(model_dir)


def run(cfg) -> dict:
    """Every experiment of the paper on one model, sharing what can be shared; results.json + figures + W&B."""
    from tqdm.auto import tqdm

    settings = cfg.study
    out = output_dir(cfg)
    note = choose_data(cfg)
    print(f"[study] {note}", flush=True)
    registry.task_spec(cfg)
    fractions = fractions_of(cfg.prune)  # validate everything cheap before any work
    orders = orders_of(cfg.prune)
    check_fractions([cfg.speed.fraction])
    clock = clock_of(cfg.speed)
    bar = tqdm(list(STAGES), desc="study", leave=True)
    bar.set_postfix_str("train")
    trained = train_stage(cfg, out) if settings.train else None
    bar.update(1)
    task = registry.load_task(cfg)
    split, selection = str(settings.split), selection_split(task, settings.get("selection_split"))
    check_split(task, split)
    check_split(task, selection, "selection")
    check_split(task, str(cfg.prune.get("ablation_split") or split), "ablation")
    groups = check_groups(cfg.prune.get("groups"), task.gates.groups)
    base = task.evaluate(None, split=split)
    print(f"[study] unmasked {task.metric} on {split}: {base.score:.2f} ({base.n} examples)", flush=True)
    fp = fingerprints(task, split)
    seed, n_samples, alpha = int(cfg.seed), int(settings.n_samples), float(settings.alpha)
    order_cfg = order_settings(cfg)

    def key(**extra):
        return {"fingerprints": fp, "split": split, "seed": seed, **extra}

    bar.set_postfix_str("scores")
    def raw_scores():
        cache: dict = {}  # the orders keep their unmasked raw scores here
        for order in ("importance", "entropy"):
            ORDERS[order].scores(task, order_cfg, shared=cache)
        return {"importance": tensor_dict(cache["importance_raw"]), "entropy": tensor_dict(cache["entropy_raw"])}

    scores = stage(out, "scores", key(importance=cfg.importance), raw_scores)
    bar.update(1)
    shared = {"importance_raw": {g: torch.tensor(v) for g, v in scores["importance"].items()},
              "entropy_raw": {g: torch.tensor(v) for g, v in scores["entropy"].items()}}

    bar.set_postfix_str("ablate")
    splits = [split] + [s for s in (settings.get("extra_splits") or []) if split_size(task, s) > 0]
    ablate = stage(out, "ablate", key(splits=splits, n_samples=n_samples, alpha=alpha), lambda: {
        "splits": {s: ablation_stage(task, s, None, n_samples, seed, alpha, base=base if s == split else None) for s in splits}})
    if len(splits) > 1:
        ablate["correlation"] = correlation(ablate["splits"][splits[0]], ablate["splits"][splits[1]])
    ablation_split = str(cfg.prune.get("ablation_split") or split)  # the oracle order's data
    if ablation_split in ablate["splits"]:
        shared["ablation_deltas"] = {g: torch.tensor(v) for g, v in ablate["splits"][ablation_split]["delta"].items()}
    bar.update(1)

    bar.set_postfix_str("keep_one")
    keep_one = stage(out, "keep_one", key(selection=selection, n_samples=n_samples, alpha=alpha),
                     lambda: keep_one_stage(task, selection, split, None, n_samples, seed, alpha, base=base))
    bar.update(1)

    bar.set_postfix_str("prune")
    prune_key = key(prune=cfg.prune, importance=cfg.importance)
    min_per_layer = int(cfg.prune.min_heads_per_layer or 0)

    def prune_all():
        result = prune_stage(task, orders, fractions, order_cfg, groups, min_per_layer, False, split, shared, base=base)
        if settings.reestimate:  # one more curve per order that can be recomputed under the current mask
            for order in [o for o in orders if ORDERS[o].reestimable]:
                again = prune_stage(task, [order], fractions, order_cfg, groups, min_per_layer, True, split, {}, base=base)
                result["orders"][f"{order} (re-estimated)"] = again["orders"][order]
        if len(task.gates.groups) > 1:  # paper section 5: one group at a time
            result["by_group"] = {g: prune_stage(task, ["importance"], fractions, order_cfg, [g], 0, False, split, {}, base=base)
                                  for g in task.gates.groups}
        return result

    prune = stage(out, "prune", prune_key, prune_all)
    bar.update(1)

    bar.set_postfix_str("pareto")  # pruning for speed: prune.target / schedule / recover (skipped when none is set)
    pareto = None
    if for_speed(cfg.prune):
        pareto = stage(out, "pareto", key(prune=cfg.prune, importance=cfg.importance, selection=selection,
                                          speed=cfg.speed if cfg.prune.get("measure_speed") else None),
                       lambda: pareto_stage(task, cfg, order_cfg, orders, fractions, split, selection, out, base=base, shared=shared))
    bar.update(1)

    bar.set_postfix_str("speed")
    fraction = check_fractions([cfg.speed.fraction])[0]
    steps = {round(s["fraction"], 6): s for s in prune["orders"].get("importance", {"steps": []})["steps"]}
    if round(fraction, 6) in steps:
        mask = task.gates.normalize_mask(mask_from_json(steps[round(fraction, 6)]["mask"]))
    else:
        mask = masks_for_fractions(shared["importance_raw"], task.gates.groups, [fraction], groups)[0]
    speed = stage(out, "speed", key(speed=cfg.speed), lambda: speed_stage(
        task, mask, split, [int(b) for b in cfg.speed.batch_sizes], int(cfg.speed.examples), int(cfg.speed.warmup),
        int(cfg.speed.repeats), seed, bool(cfg.speed.check_score), clock, **adaptive_settings(cfg.speed)))
    bar.update(1)
    bar.close()

    name = cfg.model.get("name")
    figures = [ablation_figure(r, out / f"ablate_{s}.png", f"Single-head ablation on {s} ({name})") for s, r in ablate["splits"].items()]
    figures.append(keep_one_bars(keep_one["rows"], out / "keep_one.png", f"Keep only the best head per layer ({name})",
                                 f"{task.metric} difference"))
    figures.append(pruning_curves(curves_of(prune), out / "prune.png", f"Greedy pruning ({name}, {split})", task.metric, base.score))
    if "by_group" in prune:
        figures.append(pruning_curves({g: curves_of(v)["importance"] for g, v in prune["by_group"].items()},
                                      out / "prune_groups.png", f"Pruning one attention group at a time ({name})", task.metric, base.score))
    if pareto is not None:
        figures.append(pareto_figure(pareto, out / "pareto.png", f"Quality against speed ({name}, {split})"))
    figures.append(speed_bars(speed["rows"], out / "speed.png", f"Throughput, {100 * fraction:.0f}% of heads pruned ({name})"))
    numbers = {"data_note": note, "trained_model": trained, "base_score": base.score, "metric": task.metric,
               "scores": scores, "ablate": ablate, "keep_one": keep_one, "prune": prune, "speed": speed,
               **({"pareto": pareto} if pareto is not None else {})}
    write_results(cfg, "study", numbers, task, split, inputs={"selection_split": selection, "data_note": note}, figures=figures)
    tables = {f"ablate_{s}": ablation_rows(r) for s, r in ablate["splits"].items()}
    tables.update(keep_one=keep_one_rows(keep_one), prune=prune_rows(prune), speed=speed_rows(speed))
    if pareto is not None:
        tables["pareto"] = pareto_rows(pareto)
    summary = {"base_score": base.score, "ablate": {s: r["per_group"] for s, r in ablate["splits"].items()},
               "speed_gain_at_largest_batch": speed["rows"][-1]["gain"] if speed["rows"] and not is_inconclusive(speed["rows"][-1]) else None}
    log_run(cfg, "study", summary, tables, figures)
    print(f"[study] done: {out / 'results.json'}", flush=True)
    return {"objective": base.score, **numbers}
