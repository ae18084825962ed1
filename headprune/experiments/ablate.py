"""experiment=ablate (paper 3.2; 3.4 with two splits): each unit (head, KV group or block) removed alone; score change, significance."""

from headprune.checks.prune_values import PruneValues
from headprune.checks.shared_checks import check_group_names, check_model_and_task, check_splits, check_unit, no_duplicates
from headprune.core.checks import ConfigError
from headprune.core.unit_kinds import noun
from headprune.lightning.loggers import log_run
from headprune.measures.ablation_stage import ablation_figure, ablation_stage
from headprune.measures.evaluation import check_split
from headprune.results.run_dir import write_results
from headprune.results.stream_points import streaming
from headprune.results.writer import output_dir
from headprune.scoring.significance import correlation
from headprune.selection.greedy import check_groups
from headprune.tasks import registry
from headprune.viz.tables import head_rows


def run(cfg) -> dict:
    """Ablate every unit alone on each split of ``ablate.splits``; write results.json, heatmaps, W&B."""
    settings = cfg.ablate
    task = registry.load_task(cfg)
    splits = list(settings.splits)
    for split in splits:
        check_split(task, split)
    groups = check_groups(settings.groups, task.gates.groups)
    out = output_dir(cfg)
    numbers, figures, tables = {"splits": {}}, [], {}
    for split in splits:
        result = ablation_stage(task, split, groups, int(settings.n_samples), int(cfg.seed), float(settings.alpha), progress=True)
        numbers["splits"][split] = result
        title = f"Single-{noun(task.gates.unit)} {'streaming' if streaming(task) else 'ablation'} on {split} ({cfg.model.name})"
        figures.append(ablation_figure(result, out / f"ablate_{split}.png", title))
        tables[f"ablate_{split}"] = head_rows(result, "head")
        print(
            f"{split}: base {result['metric']} {result['base_score']:.2f}; significant {noun(task.gates.unit, plural=True)} per group: "
            + ", ".join(f"{g}={v['significant']}/{v['heads']}" for g, v in result["per_group"].items())
        )
    if len(splits) > 1:
        numbers["correlation"] = correlation(numbers["splits"][splits[0]], numbers["splits"][splits[1]])
    write_results(cfg, "ablate", numbers, task, splits[0], figures=figures)
    log_run(cfg, "ablate", numbers, tables, figures)
    return {"objective": numbers["splits"][splits[0]]["base_score"], **numbers}


def check(cfg) -> None:
    """experiment=ablate: the model and task, the unit, and ablate.* (splits known and listed once)."""
    prune = PruneValues.of(cfg)
    check_model_and_task(cfg, reads_importance=False)
    check_unit(cfg, prune, single_units=True)
    splits = cfg.ablate.splits
    if not splits:
        raise ConfigError("ablate.splits is empty: give at least one evaluation split (e.g. [eval])")
    no_duplicates(splits, "ablate.splits")
    check_group_names(cfg, prune.unit, cfg.ablate.groups, "ablate.groups")
    check_splits(cfg, splits, "ablate.splits")
