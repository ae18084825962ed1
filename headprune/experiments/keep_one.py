"""experiment=keep_one (paper 3.3): keep each layer's best head, chosen on the selection split; report the drop on the evaluation split."""

from headprune.checks.prune_values import PruneValues
from headprune.checks.shared_checks import check_group_names, check_model_and_task, check_selection, check_unit
from headprune.core.checks import ConfigError
from headprune.core.unit_kinds import keep_one_refusal, noun
from headprune.lightning.loggers import log_run
from headprune.measures.ablation_stage import keep_one_stage
from headprune.measures.evaluation import check_split, selection_split
from headprune.results.run_dir import write_results
from headprune.results.stream_points import keep_one_title, streaming
from headprune.results.writer import output_dir
from headprune.selection.greedy import check_groups
from headprune.tasks import registry
from headprune.viz.plots import keep_one_bars
from headprune.viz.tables import head_rows


def run(cfg) -> dict:
    """Keep only the best head per layer; write results.json, a bar chart and log to W&B."""
    settings = cfg.keep_one
    task = registry.load_task(cfg)
    selection = selection_split(task, settings.selection_split)
    split = str(settings.split)
    check_split(task, split)
    check_split(task, selection, "selection")
    groups = check_groups(settings.groups, task.gates.groups)
    result = keep_one_stage(task, selection, split, groups, int(settings.n_samples), int(cfg.seed), float(settings.alpha), progress=True)
    out = output_dir(cfg)
    figure = keep_one_bars(
        result["rows"], out / "keep_one.png", f"{keep_one_title(task)} ({cfg.model.name}, {split})", f"{result['metric']} difference"
    )
    for r in result["rows"]:
        kept = f"keep {noun(task.gates.unit)} {r['best_head'] + 1}" + (" full, stream the others" if streaming(task) else "")
        print(f"{r['group']} layer {r['layer'] + 1}: {kept} -> {r['delta']:+.2f} (p={r['p_value']:.3f})")
    write_results(cfg, "keep_one", result, task, split, inputs={"selection_split": selection}, figures=[figure])
    log_run(cfg, "keep_one", result, {"keep_one": head_rows(result, "best_head")}, [figure])
    return {"objective": result["base_score"], **result}


def check(cfg) -> None:
    """experiment=keep_one: the model and task, the unit, and a selection split other than the evaluation split."""
    prune = PruneValues.of(cfg)
    check_model_and_task(cfg)
    check_unit(cfg, prune, single_units=True)
    refusal = keep_one_refusal(prune.unit)
    if refusal:
        raise ConfigError(f"experiment=keep_one with prune.unit={prune.unit}: {refusal}; use prune.unit=head or kv_group")
    check_group_names(cfg, prune.unit, cfg.keep_one.groups, "keep_one.groups")
    check_selection(cfg, "keep_one")
