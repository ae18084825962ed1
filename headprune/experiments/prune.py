"""experiment=prune (paper sections 4 and 5): at each fraction f mask the lowest-scoring f x N units of each order and evaluate."""

from headprune.checks.prune_checks import check_prune, physical_pruning
from headprune.checks.prune_values import PruneValues
from headprune.checks.shared_checks import check_exact_pruning, check_model_and_task, check_unit, given_settings, refuse_given
from headprune.core.checks import ConfigError
from headprune.core.unit_kinds import noun
from headprune.lightning.loggers import build_logger, log_run
from headprune.measures.evaluation import check_split, selection_split
from headprune.results.points import point_name, point_step
from headprune.results.run_dir import write_results
from headprune.results.stream_points import action_words, say_cache
from headprune.results.writer import output_dir
from headprune.selection.greedy import check_groups
from headprune.settings import RunSettings
from headprune.sources.orders import order_settings
from headprune.sources.score_file import given_scores
from headprune.stages.greedy_stage import curves_of, fractions_of, orders_of, prune_stage, step_text, warn_unmet
from headprune.stages.pareto_plan import for_speed, recoveries_of, steps_used
from headprune.stages.prune_speed import pareto_stage
from headprune.stages.recovery_check import say_worse
from headprune.tasks import registry
from headprune.viz.plots import pareto_figure, pruning_curves
from headprune.viz.tables import pareto_rows, prune_rows


def run_for_speed(cfg, settings: RunSettings, task, orders: list[str], fractions: list[float], split: str) -> dict:
    """Pruning for speed (``prune.target`` / ``schedule`` / ``recover``): Pareto points in results.json, a table and a figure."""
    selection = selection_split(task, settings.prune.selection_split)
    check_split(task, selection, "selection")
    out = output_dir(cfg)
    logger = build_logger(cfg, job_type="prune") if "finetune" in steps_used(recoveries_of(settings.prune)) else False
    where = {"split": split, "selection": selection, "seed": int(cfg.seed)}
    result = pareto_stage(task, settings, order_settings(cfg), orders, fractions, where, out, logger)
    figure = pareto_figure(result, out / "pareto.png", f"Quality against speed ({cfg.model.name}, {split})")
    for p in result["points"]:
        print(
            f"{point_name(p):>22} {point_step(p):>14}"
            + (f" ({p['kinds_removed']})" if p.get("kinds_removed") else "")
            + f": {p['score']:.2f}, predicted speed-up {p['predicted_speedup']:.2f}x"
            + (f", measured {p['measured']['speedup']:.2f}x" if p.get("measured") else "")
        )
    say_worse(result["points"])
    write_results(cfg, "prune", result, task, split, inputs={"selection_split": selection}, figures=[figure])
    log_run(cfg, "prune", {k: v for k, v in result.items() if k != "points"}, {"pareto": pareto_rows(result)}, [figure])
    best = max(result["points"][1:], key=lambda p: p["score"] if task.higher_is_better else -p["score"])
    return {"objective": best["score"], **result}


def run(cfg) -> dict:
    """Greedy pruning curve(s); results.json holds every step's mask and score, plus a figure."""
    settings = RunSettings.of(cfg)
    prune = settings.prune
    orders = orders_of(prune)
    fractions = fractions_of(prune)
    task = registry.load_task(cfg)
    groups = check_groups(prune.groups, task.gates.groups)
    split = str(prune.split)
    check_split(task, split)
    if "ablation" in orders:
        check_split(task, str(prune.ablation_split), "ablation")
    if for_speed(prune):
        return run_for_speed(cfg, settings, task, orders, fractions, split)
    shared = given_scores(prune.scores_from, orders, task, cfg.model.get("name"))
    result = prune_stage(
        task, prune, orders, fractions, order_settings(cfg), split, shared, reestimate=bool(prune.reestimate), progress=True
    )
    out = output_dir(cfg)
    verb, done = action_words(task)
    title = f"Greedy {verb} of {'+'.join(groups)} ({cfg.model.name}, {split})"
    xlabel = f"{noun(result['unit'], plural=True)} {done} (%)"
    figure = pruning_curves(curves_of(result), out / "prune.png", title, result["metric"], result["base_score"], xlabel)
    for order, v in result["orders"].items():
        print(f"{order} ({result['unit']}): " + " ".join(f"{step_text(s, result['unit'])}={s['score']:.2f}" for s in v["steps"]))
    say_cache(result)
    warn_unmet(result)
    write_results(cfg, "prune", result, task, split, figures=[figure])
    log_run(cfg, "prune", {k: v for k, v in result.items() if k != "orders"}, {"prune": prune_rows(result)}, [figure])
    return {"objective": result["orders"][orders[0]]["steps"][-1]["score"], **result}


def check(cfg) -> None:
    """experiment=prune: the model and task, the unit, prune.* (and speed.* when it measures speed)."""
    prune = PruneValues.of(cfg)
    given = given_settings(cfg, "trainer")  # trainer.* is not read: a recovery fine-tune runs on the model's device
    if given and "finetune" in prune.recovering:
        key, value = next(iter(given.items()))
        raise ConfigError(
            f"{key}={value}: prune.recover=finetune fine-tunes on the model's device (device={cfg.get('device')}), not the "
            "trainer's (trainer.* is read by training runs only): drop it and set device=cuda (or device=cpu) instead"
        )
    check_model_and_task(cfg)
    if not cfg.prune.measure_speed:
        refuse_given(cfg, ("speed",), "speed.* times Pareto points with prune.measure_speed=true only")
    check_unit(cfg, prune)
    check_exact_pruning(cfg, physical_pruning(prune), prune.unit.kinds)
    check_prune(cfg, prune)
