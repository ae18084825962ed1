"""experiment=study: fine-tune (or load) once, then ablate, keep_one, prune (all orders) and speed; a rerun skips unchanged stages."""

import shutil
from functools import partial
from pathlib import Path

from hydra import compose
from omegaconf import OmegaConf, open_dict
from tqdm.auto import tqdm

from headprune.checks.prune_checks import check_prune
from headprune.checks.prune_values import PruneValues
from headprune.checks.shared_checks import (
    check_exact_pruning,
    check_model_and_task,
    check_selection,
    check_trainer,
    check_unit,
    no_duplicates,
    task_spec_of,
)
from headprune.checks.speed_checks import check_speed_run
from headprune.conf_dir import config_dir
from headprune.core.checks import ConfigError
from headprune.core.unit_kinds import ablation_refusal, keep_one_refusal, noun
from headprune.engine.verdict import is_inconclusive
from headprune.lightning.loggers import log_run
from headprune.measures.ablation_stage import ablation_figure
from headprune.measures.evaluation import check_split, evaluate_one, selection_split
from headprune.measures.speed_stage import untimed_note
from headprune.results.run_dir import write_results
from headprune.results.stream_points import action_record, action_words, keep_one_title, streaming
from headprune.results.writer import model_fingerprint, output_dir, read_json
from headprune.selection.greedy import check_groups
from headprune.settings import RunSettings
from headprune.sources.mask_source import given_keys
from headprune.sources.orders import action_refusal, order_settings, unit_refusal
from headprune.stages.finetune_runs import check_finetune_budget
from headprune.stages.greedy_stage import curves_of, fractions_of, orders_of
from headprune.stages.saved_stages import digest, stage, training_settings
from headprune.stages.study_stages import STUDY_STAGES, StudyRun, run_stage
from headprune.tasks import registry
from headprune.tasks.stream_task import STREAM, action_of
from headprune.tasks.unit_task import unit_of
from headprune.viz.plots import keep_one_bars, pareto_figure, pruning_curves, speed_bars
from headprune.viz.tables import head_rows, pareto_rows, prune_rows, speed_rows

REUSES_STAGES = True  # rerun in its directory with other settings: unchanged stages reused, the rest recomputed (cli.py)
STAGE_TABLES = {"prune": prune_rows, "speed": speed_rows, "keep_one": partial(head_rows, head="best_head"), "pareto": pareto_rows}


def study_training_config(cfg):
    """The study's training-stage config: ``study.train_overrides`` applied to a copy."""
    sub = cfg.copy()
    for key, value in (cfg.study.train_overrides or {}).items():
        OmegaConf.update(sub, key, value, force_add=True)
    return sub


def choose_data(cfg) -> str:
    """Switch to the synthetic NLI set when the local MNLI copy is missing; returns a sentence saying which data is used."""
    data = cfg.data
    if data.get("source") == "local" and data.get("dir") and not Path(str(data.dir)).exists():
        fallback = str(cfg.study.fallback_data)
        conf = Path(config_dir()) / "data"
        try:
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


STAGES = ("train", *(s.name for s in STUDY_STAGES))  # in the order they run


def unit_orders(cfg, orders: list[str]) -> list[str]:
    """The study's orders that can rank ``prune.unit``; one line names those left out (orders given on the command line were checked)."""
    unit, action = unit_of(cfg), action_of(cfg)
    kept = [o for o in orders if unit_refusal(o, unit) is None]
    if kept != orders:
        print(f"[study] prune.unit={unit}: orders {[o for o in orders if o not in kept]} left out (they rank heads only)", flush=True)
    acting = [o for o in kept if action_refusal(o, action) is None]
    if acting != kept:
        left = [o for o in kept if o not in acting]
        print(f"[study] prune.action={action}: orders {left} left out ({action_refusal(left[0], action)})", flush=True)
    if ablation_refusal(unit):
        print(f"[study] prune.unit={unit}: the ablate and keep_one stages are skipped (one unit at a time)", flush=True)
    elif keep_one_refusal(unit):
        print(f"[study] prune.unit={unit}: the keep_one stage is skipped ({keep_one_refusal(unit)})", flush=True)
    if action == STREAM:
        print(
            "[study] prune.action=stream: the speed stage is skipped (a streamed unit keeps its weights; every prune point "
            "reports its KV cache, and bench/bench_stream_cache.py times decoding with the streaming cache)",
            flush=True,
        )
    return acting


def study_run(cfg, settings: RunSettings, out: Path, orders: list[str], fractions: list[float]) -> StudyRun:
    """The loaded task, its checked splits and unpruned score: what every stage starts from."""
    task = registry.load_task(cfg)
    study = settings.study
    split, selection = str(study.split), selection_split(task, study.selection_split)
    ablation_split = str(settings.prune.ablation_split or split)
    check_split(task, split)
    check_split(task, selection, "selection")
    check_split(task, ablation_split, "ablation")
    groups = check_groups(settings.prune.groups, task.gates.groups)
    check_finetune_budget(task, settings.prune)  # the pareto stage's fine-tune budget, before any scoring
    base = evaluate_one(task, None, split, "unpruned", progress=True)
    print(f"[study] unmasked {task.metric} on {split}: {base.score:.2f} ({base.n} examples)", flush=True)
    fingerprint = model_fingerprint(task.model)
    return StudyRun(
        cfg, settings, task, out, split, selection, ablation_split, base, orders, fractions, groups, order_settings(cfg), fingerprint
    )


def run(cfg) -> dict:
    """Every experiment of the paper on one model, sharing what can be shared; results.json + figures + W&B."""
    settings = RunSettings.of(cfg)
    out = output_dir(cfg)
    note = choose_data(cfg)
    print(f"[study] {note}", flush=True)
    registry.task_spec(cfg)
    fractions, orders = fractions_of(settings.prune), unit_orders(cfg, orders_of(settings.prune))
    bar = tqdm(list(STAGES), desc="study", leave=True)
    bar.set_postfix_str("train")
    trained = train_stage(cfg, out) if settings.study.train else None
    bar.update(1)
    ctx = study_run(cfg, settings, out, orders, fractions)
    for row in STUDY_STAGES:
        bar.set_postfix_str(row.name)
        run_stage(ctx, row)
        bar.update(1)
    bar.close()
    numbers = write_study(ctx, note, trained, study_figures(ctx))
    print(f"[study] done: {out / 'results.json'}", flush=True)
    if "speed" in ctx.results:
        untimed_note(ctx.results["speed"], settings.speed.max_seconds, "[study] speed:")
    return {"objective": ctx.base.score, **numbers}


def study_figures(ctx: StudyRun) -> list:
    """Heatmaps per ablated split, keep_one bars, pruning curves (per group too), the Pareto plot and the speed bars."""
    r, out, name, task, base = ctx.results, ctx.out, ctx.cfg.model.get("name"), ctx.task, ctx.base.score
    ablated = r["ablate"]["splits"] if "ablate" in r else {}  # neither ablate nor keep_one for neurons
    unit, (verb, done) = task.gates.unit, action_words(task)
    what = f"Single-{noun(unit)} {'streaming' if streaming(task) else 'ablation'}"
    figures = [ablation_figure(v, out / f"ablate_{s}.png", f"{what} on {s} ({name})") for s, v in ablated.items()]
    if "keep_one" in r:
        title = f"{keep_one_title(task)} ({name})"
        figures.append(keep_one_bars(r["keep_one"]["rows"], out / "keep_one.png", title, f"{task.metric} difference"))
    title, xlabel = f"Greedy {verb} ({name}, {ctx.split})", f"{noun(unit, plural=True)} {done} (%)"
    figures.append(pruning_curves(curves_of(r["prune"]), out / "prune.png", title, task.metric, base, xlabel))
    if "by_group" in r["prune"]:
        by_group = {g: curves_of(v)["importance"] for g, v in r["prune"]["by_group"].items()}
        title = f"Pruning one attention group at a time ({name})"
        figures.append(pruning_curves(by_group, out / "prune_groups.png", title, task.metric, base))
    if "pareto" in r:
        figures.append(pareto_figure(r["pareto"], out / "pareto.png", f"Quality against speed ({name}, {ctx.split})"))
    if "speed" in r and r["speed"]["rows"]:
        fraction = float(ctx.settings.speed.fraction)
        title = f"Throughput, {100 * fraction:.0f}% of {noun(task.gates.unit, plural=True)} pruned ({name})"
        figures.append(speed_bars(r["speed"]["rows"], out / "speed.png", title))
    return figures


def write_study(ctx: StudyRun, note: str, trained: str | None, figures: list) -> dict:
    """results.json (every stage's results, with each stage's fingerprint), and the tables and summary in W&B."""
    r, cfg = ctx.results, ctx.cfg
    numbers = {"data_note": note, "trained_model": trained, "base_score": ctx.base.score, "metric": ctx.task.metric}
    numbers.update(action_record(ctx.task))
    numbers.update({name: r[name] for name in ("scores", "ablate", "keep_one", "prune", "speed", "pareto") if name in r})
    fingerprints = {k: digest(ctx.keys[k]) for k in ("scores", "ablate", "keep_one", "prune", "speed", "pareto") if k in ctx.keys}
    inputs = {"selection_split": ctx.selection, "data_note": note, "stage_fingerprints": fingerprints}
    write_results(cfg, "study", numbers, ctx.task, ctx.split, figures=figures, inputs=inputs)
    tables = {f"ablate_{s}": head_rows(v, "head") for s, v in (r["ablate"]["splits"] if "ablate" in r else {}).items()}
    tables.update({name: rows(r[name]) for name, rows in STAGE_TABLES.items() if name in r})
    last = r["speed"]["rows"][-1] if "speed" in r and r["speed"]["rows"] else None
    summary = {
        "base_score": ctx.base.score,
        "ablate": {s: v["per_group"] for s, v in r["ablate"]["splits"].items()} if "ablate" in r else None,
        "speed_gain_at_largest_batch": last["gain"] if last and not is_inconclusive(last) else None,
    }
    log_run(cfg, "study", summary, tables, figures)
    return numbers


def check(cfg) -> None:
    """experiment=study: the model and task (local data may fall back), its stages' settings, its training, its split choice."""
    prune = PruneValues.of(cfg)
    check_model_and_task(cfg, falls_back=True)  # a resumed study's damaged stage files are named and recomputed, not errors
    given = given_keys()
    check_unit(cfg, prune, orders=given is None or "prune.order" in given)  # the study's own orders are fitted to the unit in run
    streamed = prune.action == STREAM  # no speed stage: nothing is pruned physically
    check_exact_pruning(cfg, None if streamed else "its speed measurement times the physically pruned model", prune.unit.kinds)
    check_selection(cfg, "study")
    no_duplicates(cfg.study.extra_splits, "study.extra_splits")
    if cfg.study.train:
        check_trainer(study_training_config(cfg).trainer)
    if cfg.prune.reestimate:
        raise ConfigError("the study re-estimates with study.reestimate=true (one more curve per order); prune.reestimate is ignored here")
    if cfg.prune.get("scores_from") is not None:
        raise ConfigError(
            f"prune.scores_from={cfg.prune.scores_from}: the study scores its own orders (its scores stage); fixed scores "
            "rank the curves of experiment=prune: drop it here"
        )
    speed = cfg.speed
    if speed.get("mask_file") or speed.get("mask_step") is not None or speed.get("point") or speed.mask_order != "importance":
        raise ConfigError(
            "the study times the importance order's mask at speed.fraction: speed.mask_file, speed.mask_step, speed.point "
            "and speed.mask_order belong to experiment=speed; drop them here"
        )
    check_prune(cfg, prune, alone=False)  # the study ablates anyway
    check_speed_run(cfg)
    spec = task_spec_of(cfg)
    if cfg.study.train and spec.train is None:  # last: the stages' own settings are told first
        raise ConfigError(
            f"study.train=true trains the model first, and the {spec.name} task has no trainer: set study.train=false "
            "(the study then prunes model.pretrained, or the model.config one as built)"
        )
