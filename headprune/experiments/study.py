"""experiment=study: fine-tune (or load) once, then ablate, keep_one, prune (all orders) and speed.

The stages share the model, the data, the unmasked score and the importance/entropy scores. Each
stage writes ``stages/<name>.json`` with its key (settings, model and data fingerprints, the earlier
results it used) when it completes; a rerun in the same run directory (``hydra.run.dir=<that dir>``)
skips every stage whose key is unchanged, and recomputes, saying why, a stage whose settings or
inputs changed or whose file is damaged (see ``headprune.experiments.stages``). ``make demo`` runs
this on the embedded MiniLM: fine-tuned on the local MNLI copy when there is one, else on the
synthetic NLI set (it says which).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from omegaconf import OmegaConf, open_dict

from headprune.engine.verdict import is_inconclusive
from headprune.experiments.ablate import ablation_figure, ablation_stage
from headprune.experiments.conf_dir import config_dir
from headprune.experiments.evaluation import check_split, selection_split, split_size
from headprune.experiments.keep_one import keep_one_stage
from headprune.experiments.orders import ORDERS, order_settings
from headprune.experiments.prune import curves_of, fractions_of, orders_of, prune_stage
from headprune.experiments.prune_speed import for_speed, pareto_stage
from headprune.experiments.speed import adaptive_settings, clock_of, speed_stage
from headprune.experiments.stages import digest, stage, training_settings
from headprune.lightning.loggers import log_run
from headprune.results.run_dir import mask_from_json, mask_to_json, tensor_dict, write_results
from headprune.results.writer import batches_fingerprint, model_fingerprint, output_dir, read_json
from headprune.scoring.significance import correlation
from headprune.selection.greedy import check_fractions, check_groups
from headprune.selection.uniform import layout_masks, layout_of
from headprune.tasks import registry
from headprune.viz.plots import keep_one_bars, pareto_figure, pruning_curves, speed_bars
from headprune.viz.tables import ablation_rows, keep_one_rows, pareto_rows, prune_rows, speed_rows

STAGES = ("train", "scores", "ablate", "keep_one", "prune", "pareto", "speed")
IMPORTANCE_DATA = "importance batches"  # the data fingerprint of task.importance_batches()
REUSES_STAGES = True  # rerun in its directory with other settings: unchanged stages reused, the rest recomputed (cli.py)


def study_training_config(cfg):
    """The study's training-stage config: ``study.train_overrides`` applied to a copy."""
    sub = cfg.copy()
    for key, value in (cfg.study.get("train_overrides") or {}).items():
        OmegaConf.update(sub, key, value, force_add=True)
    return sub


def choose_data(cfg) -> str:
    """Switch to the synthetic NLI set when the local MNLI copy is missing; returns a sentence saying which data is used."""
    data = cfg.data
    if data.get("source") == "local" and data.get("dir") and not Path(str(data.dir)).exists():
        fallback = str(cfg.study.fallback_data)
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


def train_stage(cfg, out: Path) -> str:
    """Train the task's model into <out>/train (reused when its settings are unchanged); point ``model.pretrained`` at it."""
    train_dir = out / "train"
    model_dir = train_dir / "model"
    sub = study_training_config(cfg)
    key = {"settings": training_settings(sub)}
    problem = missing_training_output(train_dir)
    record = out / "stages" / "train.json"
    if problem and record.exists():
        print(f"[study] train: {problem}: retraining", flush=True)
        record.unlink()
    elif not problem and not record.exists():
        print(f"[study] train: no record of the settings the model in {model_dir} was trained with: retraining", flush=True)

    def train() -> dict:
        if (train_dir / "checkpoints").exists() and (train_dir / "results.json").exists():
            print(f"[study] train: removing the previous training's checkpoints in {train_dir / 'checkpoints'}", flush=True)
            shutil.rmtree(train_dir / "checkpoints")  # a finished run's last.ckpt must not seed this one (ckpt_path=last)
        with open_dict(sub):
            sub.paths.output_dir = str(train_dir)
            sub.experiment_name = "study_train"
        return {"model_dir": str(model_dir), "metrics": registry.train_task(sub)}

    stage(out, "train", key, train)
    with open_dict(cfg):
        cfg.model.pretrained = str(model_dir)
        cfg.model.tokenizer = str(model_dir)  # the saved model dir holds its tokenizer
    return str(model_dir)


def missing_training_output(train_dir: Path) -> str | None:
    """Why a finished training in ``train_dir`` cannot be reused (model or results.json missing or damaged), or None."""
    if not (train_dir / "model" / "config.json").is_file():
        return f"no saved model in {train_dir / 'model'}"
    try:
        read_json(train_dir / "results.json")
    except FileNotFoundError:
        return f"{train_dir / 'results.json'} is missing"
    except ValueError:
        return f"{train_dir / 'results.json'} is not valid JSON (damaged: an interrupted write?)"
    return None


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
    seed, n_samples, alpha = int(cfg.seed), int(settings.n_samples), float(settings.alpha)
    order_cfg = order_settings(cfg)
    model_fp, data_fps = model_fingerprint(task.model), {}

    def data_fingerprint(name: str) -> str:
        if name not in data_fps:  # "importance batches": what the importance and entropy scores read
            data_fps[name] = batches_fingerprint(task.importance_batches()) if name == IMPORTANCE_DATA else task.data_fingerprint(name)
        return data_fps[name]

    def key(reads: dict, data: list[str], inputs: dict | None = None) -> dict:
        """A stage's key: the settings it reads, the model and data it runs on, digests of the earlier stages it uses."""
        return {
            "settings": {"seed": seed, **reads},
            "fingerprints": {"model": model_fp, "data": {name: data_fingerprint(name) for name in dict.fromkeys(data)}},
            "inputs": inputs or {},
        }

    bar.set_postfix_str("scores")

    def raw_scores():
        cache: dict = {}  # the orders keep their unmasked raw scores here
        for order in ("importance", "entropy"):
            ORDERS[order].scores(task, order_cfg, shared=cache)
        return {"importance": tensor_dict(cache["importance_raw"]), "entropy": tensor_dict(cache["entropy_raw"])}

    scores_key = key({"importance": cfg.importance}, [IMPORTANCE_DATA])
    scores = stage(out, "scores", scores_key, raw_scores)
    upstream = {"scores": digest([scores_key, scores])}  # what a later stage saw of an earlier one: its key and results
    bar.update(1)
    shared = {
        "importance_raw": {g: torch.tensor(v) for g, v in scores["importance"].items()},
        "entropy_raw": {g: torch.tensor(v) for g, v in scores["entropy"].items()},
    }

    bar.set_postfix_str("ablate")
    splits = [split] + [s for s in (settings.get("extra_splits") or []) if split_size(task, s) > 0]
    ablate_key = key({"splits": splits, "n_samples": n_samples, "alpha": alpha}, splits)
    ablate = stage(
        out,
        "ablate",
        ablate_key,
        lambda: {"splits": {s: ablation_stage(task, s, None, n_samples, seed, alpha, base=base if s == split else None) for s in splits}},
    )
    upstream["ablate"] = digest([ablate_key, ablate])
    if len(splits) > 1:
        ablate["correlation"] = correlation(ablate["splits"][splits[0]], ablate["splits"][splits[1]])
    ablation_split = str(cfg.prune.get("ablation_split") or split)  # the oracle order's data
    if ablation_split in ablate["splits"]:
        shared["ablation_deltas"] = {g: torch.tensor(v) for g, v in ablate["splits"][ablation_split]["delta"].items()}
    bar.update(1)

    bar.set_postfix_str("keep_one")
    keep_one_key = key({"split": split, "selection": selection, "n_samples": n_samples, "alpha": alpha}, [split, selection])
    keep_one = stage(out, "keep_one", keep_one_key, lambda: keep_one_stage(task, selection, split, None, n_samples, seed, alpha, base=base))
    bar.update(1)

    bar.set_postfix_str("prune")
    prune_key = key(
        {"split": split, "prune": cfg.prune, "importance": cfg.importance, "reestimate": settings.reestimate},
        [split, ablation_split, IMPORTANCE_DATA],
        {"scores": upstream["scores"], "ablate": upstream["ablate"] if "ablation_deltas" in shared else None},
    )
    min_per_layer = int(cfg.prune.min_heads_per_layer or 0)
    layout = layout_of(cfg.prune)

    def prune_all():
        result = prune_stage(task, orders, fractions, order_cfg, groups, min_per_layer, False, split, shared, base=base, layout=layout)
        if settings.reestimate:  # one more curve per order that can be recomputed under the current mask
            for order in [o for o in orders if ORDERS[o].reestimable]:
                again = prune_stage(task, [order], fractions, order_cfg, groups, min_per_layer, True, split, {}, base=base, layout=layout)
                result["orders"][f"{order} (re-estimated)"] = again["orders"][order]
        if len(task.gates.groups) > 1:  # paper section 5: one group at a time
            result["by_group"] = {
                g: prune_stage(task, ["importance"], fractions, order_cfg, [g], 0, False, split, {}, base=base, layout=layout)
                for g in task.gates.groups
            }
        return result

    prune = stage(out, "prune", prune_key, prune_all)
    upstream["prune"] = digest([prune_key, prune])
    bar.update(1)

    bar.set_postfix_str("pareto")  # pruning for speed: prune.target / schedule / recover (skipped when none is set)
    pareto = None
    if for_speed(cfg.prune):
        pareto_key = key(
            {
                "split": split,
                "selection": selection,
                "prune": cfg.prune,
                "importance": cfg.importance,
                "speed": cfg.speed if cfg.prune.get("measure_speed") else None,
            },
            [split, selection, IMPORTANCE_DATA],
            {"scores": upstream["scores"]},
        )
        pareto = stage(
            out,
            "pareto",
            pareto_key,
            lambda: pareto_stage(task, cfg, order_cfg, orders, fractions, split, selection, out, base=base, shared=shared),
        )
    bar.update(1)

    bar.set_postfix_str("speed")
    fraction = check_fractions([cfg.speed.fraction])[0]
    steps = {round(s["fraction"], 6): s for s in prune["orders"].get("importance", {"steps": []})["steps"]}
    if round(fraction, 6) in steps:
        mask = task.gates.normalize_mask(mask_from_json(steps[round(fraction, 6)]["mask"]))
    else:
        mask = layout_masks(shared["importance_raw"], task.gates.groups, [fraction], groups, layout=layout)[0]
    speed_key = key({"split": split, "speed": cfg.speed}, [split], {"mask": mask_to_json(mask), "prune": upstream["prune"]})
    speed = stage(
        out,
        "speed",
        speed_key,
        lambda: speed_stage(
            task,
            mask,
            split,
            [int(b) for b in cfg.speed.batch_sizes],
            int(cfg.speed.examples),
            int(cfg.speed.warmup),
            int(cfg.speed.repeats),
            seed,
            bool(cfg.speed.check_score),
            clock,
            **adaptive_settings(cfg.speed),
        ),
    )
    bar.update(1)
    bar.close()

    name = cfg.model.get("name")
    figures = [ablation_figure(r, out / f"ablate_{s}.png", f"Single-head ablation on {s} ({name})") for s, r in ablate["splits"].items()]
    figures.append(
        keep_one_bars(keep_one["rows"], out / "keep_one.png", f"Keep only the best head per layer ({name})", f"{task.metric} difference")
    )
    figures.append(pruning_curves(curves_of(prune), out / "prune.png", f"Greedy pruning ({name}, {split})", task.metric, base.score))
    if "by_group" in prune:
        figures.append(
            pruning_curves(
                {g: curves_of(v)["importance"] for g, v in prune["by_group"].items()},
                out / "prune_groups.png",
                f"Pruning one attention group at a time ({name})",
                task.metric,
                base.score,
            )
        )
    if pareto is not None:
        figures.append(pareto_figure(pareto, out / "pareto.png", f"Quality against speed ({name}, {split})"))
    figures.append(speed_bars(speed["rows"], out / "speed.png", f"Throughput, {100 * fraction:.0f}% of heads pruned ({name})"))
    numbers = {
        "data_note": note,
        "trained_model": trained,
        "base_score": base.score,
        "metric": task.metric,
        "scores": scores,
        "ablate": ablate,
        "keep_one": keep_one,
        "prune": prune,
        "speed": speed,
        **({"pareto": pareto} if pareto is not None else {}),
    }
    stage_keys = {
        "scores": scores_key,
        "ablate": ablate_key,
        "keep_one": keep_one_key,
        "prune": prune_key,
        "speed": speed_key,
        **({"pareto": pareto_key} if pareto is not None else {}),
    }
    write_results(
        cfg,
        "study",
        numbers,
        task,
        split,
        figures=figures,
        inputs={"selection_split": selection, "data_note": note, "stage_fingerprints": {k: digest(v) for k, v in stage_keys.items()}},
    )
    tables = {f"ablate_{s}": ablation_rows(r) for s, r in ablate["splits"].items()}
    tables.update(keep_one=keep_one_rows(keep_one), prune=prune_rows(prune), speed=speed_rows(speed))
    if pareto is not None:
        tables["pareto"] = pareto_rows(pareto)
    summary = {
        "base_score": base.score,
        "ablate": {s: r["per_group"] for s, r in ablate["splits"].items()},
        "speed_gain_at_largest_batch": speed["rows"][-1]["gain"] if speed["rows"] and not is_inconclusive(speed["rows"][-1]) else None,
    }
    log_run(cfg, "study", summary, tables, figures)
    print(f"[study] done: {out / 'results.json'}", flush=True)
    return {"objective": base.score, **numbers}
