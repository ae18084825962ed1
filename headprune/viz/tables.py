"""The one renderer of results: markdown tables (docs/results.md, report.md) and table rows (W&B, CSV)."""

from headprune.core.unit_kinds import kind_of_group, noun, shrunk_fields, unit_kinds
from headprune.engine.verdict import is_inconclusive, prunable_fraction
from headprune.results.points import (
    fine_tuned,
    kinds_label,
    point_name,
    point_step,
    removed_fraction,
    step_label,
    units_removed,
    units_total,
)
from headprune.scoring.significance import correlation

NAMES = {"bleu": "BLEU"}  # how a metric is written; others by their own name
UNITS = {"accuracy": "point", "bleu": "BLEU"}  # how a score difference is read; others by the metric's name


def name_of(metric: str) -> str:
    return NAMES.get(metric, metric)


def unit_of(metric: str) -> str:
    """The unit of a score difference of ``metric`` (accuracy points, BLEU, ...)."""
    return UNITS.get(metric, name_of(metric))


PAPER_SPEED = {1: 1.9, 4: 2.7, 16: 17.5, 64: 17.5}


def markdown(header: list, rows=()) -> list[str]:
    """A markdown table's lines: the header, its rule, then one line per row of cells."""
    return [_line(header), "|---" * len(header) + "|", *(_line(row) for row in rows)]


def _line(cells) -> str:
    """One markdown table line of ``cells``."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def stage_of(payload: dict, name: str) -> dict:
    """A study's stage ``name`` (ablate, keep_one, prune, speed), or the numbers of a run of that experiment alone."""
    results = payload.get("results", payload)
    return results.get(name, results)


def ablation_table(study: dict, split: str = "eval") -> str:
    abl = stage_of(study, "ablate")["splits"][split]
    header = ["group", "heads", "not significant", "significantly worse", "significantly better", "largest drop", "largest gain"]
    rows = [
        [group, g["heads"], f"{g['heads'] - g['significant']} ({100 * (g['heads'] - g['significant']) / g['heads']:.0f}%)"]
        + [g["significant_worse"], g["significant_better"], f"{g['max_drop'] + 0.0:.2f}", f"{g['max_gain'] + 0.0:.2f}"]
        for group, g in abl["per_group"].items()
    ]
    boot = abl["bootstrap"]
    return "\n".join(markdown(header, rows)) + (
        f"\n\nBase {abl['metric']} {abl['base_score']:.2f} on {abl['n_examples']} examples of `{abl['split']}`; "
        f"{boot['test']}, {boot['n_samples']} resamples, p < {boot['alpha']}, seed {boot['seed']}."
    )


def keep_one_table(study: dict) -> str:
    k = stage_of(study, "keep_one")
    header = ["group", "layer", "best head (chosen on selection split)", "score", "change", "p", "significant"]
    rows = [
        [r["group"], r["layer"] + 1, r["best_head"] + 1, f"{r['score']:.2f}", f"{r['delta']:+.2f}", f"{r['p_value']:.3f}"]
        + ["yes" if r["significant"] else "no"]
        for r in k["rows"]
    ]
    return "\n".join(markdown(header, rows)) + (
        f"\n\nBase {k['metric']} {k['base_score']:.2f} on {k['n_examples']} examples of `{k['split']}`; "
        f"heads chosen on `{k['selection_split']}` (base {k['selection_base_score']:.2f})."
    )


def _curves_table(first_column: str, curves: dict[str, list[dict]], tolerance: float, unit: str, stage: dict) -> str:
    """Score at each fraction, one column per curve of ``stage``, and the largest fraction within ``tolerance`` of unpruned."""
    # results before the field: perplexity is the one lower-is-better metric
    higher_is_better = bool(stage.get("higher_is_better", stage.get("metric") != "perplexity"))
    names = list(curves)
    rows = [[step_label(step), *(f"{curves[n][index]['score']:.2f}" for n in names)] for index, step in enumerate(curves[names[0]])]
    shares = [f"{100 * prunable_share(curves[n], tolerance, higher_is_better):.0f}%" for n in names]
    return "\n".join(markdown([first_column, *names], [*rows, [f"**prunable with < {tolerance:g} {unit} loss**", *shares]]))


def prunable_share(steps: list[dict], tolerance: float, higher_is_better: bool) -> float:
    """The largest fraction of a curve within ``tolerance`` of its first (unpruned) step."""
    return prunable_fraction([removed_fraction(s) for s in steps], [s["score"] for s in steps], tolerance, higher_is_better)


def prune_table(study: dict, tolerance: float = 1.0, unit: str = "point") -> str:
    """Greedy pruning, one column per order (paper Figure 2)."""
    stage = stage_of(study, "prune")
    curves = {name: curve["steps"] for name, curve in stage["orders"].items()}
    return _curves_table("heads pruned", curves, tolerance, unit, stage)


def study_groups_table(study: dict, tolerance: float = 1.0, unit: str = "BLEU") -> str:
    """A study's importance-order pruning of all groups and of each group alone (paper Figures 2 and 3)."""
    p = stage_of(study, "prune")
    curves = {
        "all groups": p["orders"]["importance"]["steps"],
        **{f"{g} only": v["orders"]["importance"]["steps"] for g, v in p["by_group"].items()},
    }
    return _curves_table("share of the pruned heads' group(s) removed", curves, tolerance, unit, p)


def speed_table(study: dict) -> str:
    s = stage_of(study, "speed")
    header = ["batch", "original ex/s", "pruned ex/s", "gain", "FLOP-ideal gain", "measured / ideal", "paper gain (BERT-base, GPU)"]
    rows = []
    for r in s["rows"]:
        noise = is_inconclusive(r)
        ratio = "n/a" if r.get("gain_vs_ideal") is None or noise else f"{100 * r['gain_vs_ideal']:.0f}%"
        paper = PAPER_SPEED.get(r["batch_size"])
        rows.append(
            [r["batch_size"], *(f"{r[m]['examples_per_s']:.1f} +- {r[m]['spread']:.1f}" for m in ("original", "pruned"))]
            + ["inconclusive" if noise else f"{100 * r['gain']:+.1f}%", f"{100 * r['flop_ideal_gain']:+.1f}%", ratio]
            + [f"+{paper}%" if paper else "n/a%"]
        )
    lines = markdown(header, rows)
    lines += [f"| {r['batch_size']} | {r['verdict']} | | | | | |" for r in s.get("not_timed") or []]  # the time budget ran out here
    cost = s["cost"]
    check = s.get("score_check")
    checked = (
        f"masked score {check['masked']:.2f}, pruned score {check['pruned']:.2f} "
        f"(equal: {check['equal']}{'' if check.get('agree') is None else ', agree within the tolerance: ' + str(check['agree'])})"
        if check
        else "scores not checked"
    )
    lines += [
        "",
        f"{units_removed(s)} of {units_total(s)} {noun(_unit(s.get('unit')), plural=True)} removed on `{s['device']}`; parameters "
        f"{cost['original']['parameters']:,} -> {cost['pruned']['parameters']:,}, attention FLOPs "
        f"{cost['original']['attention_flops']:,} -> {cost['pruned']['attention_flops']:,} per example; {checked}.",
    ]
    target = s.get("target")
    if target and target.get("speedup"):
        measured = ", ".join(
            "inconclusive" if is_inconclusive(r) else f"{1 + r['gain']:.2f}x at batch {r['batch_size']}" for r in s["rows"]
        )
        lines.append(f"Speed-up target {target['speedup']:g} (predicted {target['predicted_speedup']:.2f}x): measured {measured}.")
    return "\n".join(lines)


def point_speed(point: dict) -> float:
    """A point's speed-up: measured when it was timed, else predicted by the cost model."""
    measured = point.get("measured")
    return float(measured["speedup"]) if measured else float(point["predicted_speedup"])


def pareto_front(points: list[dict], higher_is_better: bool = True) -> list[bool]:
    """For each point, whether no other point is at least as good and as fast, and better or faster."""
    quality = [p["score"] if higher_is_better else -p["score"] for p in points]
    speed = [point_speed(p) for p in points]
    return [
        not any(
            quality[j] >= quality[i] and speed[j] >= speed[i] and (quality[j] > quality[i] or speed[j] > speed[i])
            for j in range(len(points))
        )
        for i in range(len(points))
    ]


def target_check(point: dict) -> str:
    """`` (target met)`` / `` (target missed)`` for a timed point pruned to a speed-up target, else empty."""
    wanted = (point.get("target") or {}).get("speedup")
    if wanted is None or not point.get("measured"):
        return ""
    return " (target met)" if point["measured"]["speedup"] >= wanted else " (target missed)"


def merged_pareto(*payloads: dict) -> dict:
    """One Pareto result from several prune-for-speed runs of one model on one evaluation set (the first run's unpruned point)."""
    stages = [{**stage, "points": with_control_scores(stage["points"])} for stage in (stage_of(p, "pareto") for p in payloads)]
    first = stages[0]
    for other in stages[1:]:
        for key in ("metric", "split", "n_examples", "base_score"):
            if other.get(key) != first.get(key):
                raise ValueError(f"cannot merge Pareto runs with different {key}: {first.get(key)!r} vs {other.get(key)!r}")
    unique = {}
    later = (q for other in stages[1:] for q in other["points"] if q["order"] != "unpruned" or q.get("control"))
    for q in (*first["points"], *later):  # the same point in two runs (same method, step, mask and score) is listed once
        unique.setdefault((point_name(q), q["step"], repr(q.get("mask")), q["score"]), dict(q))
    points = list(unique.values())
    timed = {
        repr(q["mask"]): q["measured"]
        for q in points  # timings of the mask's own pruned copy, not of a recovered model
        if q.get("measured") and "mask" in q and q["measured"].get("model") != "recovered"
    }
    for q in points:  # speed depends on the mask only: an untimed point takes the timing of a timed point with the same mask
        if not q.get("measured") and repr(q.get("mask")) in timed:
            q["measured"] = {**timed[repr(q["mask"])], "same_mask_as_timed_point": True}
    return {**first, "points": points}


def with_control_scores(points: list[dict]) -> list[dict]:
    """Copies of one run's points; its fine-tuned points carry ``control_score``, the score of the run's control, when it has
    one, and ``versus``, their own; per byte of text for a point read through its own tokenizer (its tokens are not the control's)."""
    control = next((q for q in points if q.get("control")), None)
    by = ["perplexity_per_byte" if (q.get("tokenizer") or {}).get("compared_by") == "bits_per_byte" else "score" for q in points]
    return [
        {**q, "control_score": q.get("control_score", control[k]), "versus": q[k]} if control is not None and fine_tuned(q) else dict(q)
        for q, k in zip(points, by)
    ]


def versus_control(point: dict, higher_is_better: bool) -> str:
    """A fine-tuned point against its control: metric points (accuracy, BLEU) or percent (perplexity); "" without one."""
    control = point.get("control_score")
    if control is None:
        return ""
    mine = point.get("versus", point["score"])
    return f"{mine - control:+.2f}" if higher_is_better else f"{100 * (mine / control - 1):+.1f}%"


def kv_cache_kept(point: dict, unit) -> float | None:
    """The share of the KV cache a KV-group mask keeps (a layer left without a KV head keeps one phantom head); other groups aside."""
    mask = point.get("mask") or {}
    rows = [row for name, group in mask.items() if "num_key_value_heads" in kind_of_group(name, unit).config_fields for row in group]
    if not rows:  # no KV group in the mask
        return None
    return sum(max(sum(row), 1) for row in rows) / sum(len(row) for row in rows)


def pareto_rows(result: dict) -> tuple[list[str], list[list]]:
    """One row per Pareto point (W&B, CSV): the columns of the Pareto table, unrounded."""
    stage = stage_of(result, "pareto")
    extra = stage.get("extra_splits") or []
    rows = [
        {
            "method": point_name(p),
            "order": p["order"],
            "recovery": p["recovery"],
            "step": point_step(p),
            "units_removed": units_removed(p),
            "score": p["score"],
            **{f"score_{s}": ((p.get("extra") or {}).get(s) or {}).get("score") for s in extra},
            "predicted_speedup": p["predicted_speedup"],
            "flops_kept": p["flops_kept"],
            "measured_examples_per_s": (p.get("measured") or {}).get("examples_per_s"),
            "measured_speedup": (p.get("measured") or {}).get("speedup"),
            "pareto": best,
        }
        for p, best in zip(stage["points"], pareto_front(stage["points"], stage.get("higher_is_better", True)))
    ]
    return list(rows[0]), [list(row.values()) for row in rows]  # every run has its unpruned point


def _unit(value) -> str:
    """A results file's unit as a unit name (``head`` when it names none this version knows)."""
    try:
        return "+".join(unit_kinds(value)) if value else "head"
    except (ValueError, TypeError):
        return "head"


def pareto_table(study: dict) -> str:
    """Quality against measured (or predicted) throughput for every order and recovery, Pareto points marked."""
    p = stage_of(study, "pareto")
    higher = p.get("higher_is_better", True)
    points = with_control_scores(p["points"])
    # a vocabulary cut reads its own tokenizer's split of the text: points compare per byte, not per token
    per_byte = any(q.get("relative_by") == "bits_per_byte" for q in points) and all("bits_per_byte" in q for q in points)
    front = pareto_front([{**q, "score": q["bits_per_byte"]} for q in points], False) if per_byte else pareto_front(points, higher)
    timed = any(q.get("measured") for q in points)
    extra = p.get("extra_splits") or []
    unit = _unit(p.get("unit"))
    joint = len(unit_kinds(unit)) > 1
    controlled = any(q.get("control") for q in points)
    metric = name_of(p["metric"])

    def kv_kept(q: dict) -> str:
        """The KV cache kept cell."""
        kept = kv_cache_kept(q, unit) if units_removed(q) else 1.0
        return f"{100 * kept:.1f}%" if kept is not None else "n/a"

    def removed(q: dict) -> str:
        """The units removed cell (of each kind for a joint unit)."""
        return f"{units_removed(q)}/{units_total(q)}" + (f" ({kinds_label(q['mask'], unit)})" if joint and q.get("mask") else "")

    columns = [  # (header, shown, the cell of a point)
        ("method", True, point_name),
        ("step", True, point_step),
        (f"{noun(unit, plural=True)} removed", True, removed),
        (metric, True, lambda q: f"{q['score']:.2f}"),
        ("bits per byte", per_byte, lambda q: f"{q['bits_per_byte']:.4f}"),
        ("vs control", controlled, lambda q: versus_control(q, higher)),
        *(
            (f"{metric} on `{s}`", True, lambda q, s=s: f"{q['extra'][s]['score']:.2f}" if s in (q.get("extra") or {}) else "n/a")
            for s in extra
        ),
        ("KV cache kept", "num_key_value_heads" in shrunk_fields(unit), kv_kept),
        ("predicted speed-up", True, lambda q: f"{q['predicted_speedup']:.2f}x"),
        ("FLOPs kept", True, lambda q: f"{100 * q['flops_kept']:.0f}%"),
        ("weight bytes kept", p.get("cost") == "bytes", lambda q: f"{100 * q['bytes_kept']:.1f}%" if "bytes_kept" in q else "n/a"),
        ("measured ex/s", timed, lambda q: f"{q['measured']['examples_per_s']:.1f}" if q.get("measured") else "n/a"),
        ("measured speed-up", timed, lambda q: f"{q['measured']['speedup']:.2f}x{target_check(q)}" if q.get("measured") else "n/a"),
    ]
    shown = [(name, cell) for name, wanted, cell in columns if wanted]
    rows = [[cell(q) for _, cell in shown] + ["yes" if best else ""] for q, best in zip(points, front)]
    lines = markdown([name for name, _ in shown] + ["Pareto"], rows)
    speed_of = "measured speed-up at the largest timed batch" if timed else f"speed-up predicted by the {p['cost']} cost model"
    lines += [
        "",
        f"{metric} on `{p['split']}` ({p['n_examples']} examples); Pareto = no other point is both at least as "
        f"good and at least as fast, by {speed_of}"
        + (" and bits per byte (a cut vocabulary's points read its own tokenizer's split of the text)" if per_byte else "")
        + f"; targets chosen on `{p['selection_split']}`."
        + (
            " vs control: a fine-tuned point against the unpruned model given the same fine-tune in its run "
            "(a schedule's control had every round; a point read through its own tokenizer, per byte of text)."
            if controlled
            else ""
        ),
    ]
    return "\n".join(lines)


def dynamics_table(dynamics: dict, at: float = 0.4, paper: dict | None = None) -> str:
    """Per snapshot: unpruned score, score at ``at`` pruned, prunable share, rank stability (and the paper's score)."""
    snaps = dynamics["snapshots"]
    metric = snaps[0]["metric"] if snaps else ""
    label, tolerance = name_of(metric), snaps[0]["tolerance"] if snaps else 1.0
    by_step = any(s.get("label") for s in snaps)  # checkpoints of a pretraining run, named by step
    header = ["checkpoint" if by_step else "epoch", f"unpruned {label}", f"{label} at {100 * at:.0f}% pruned", "relative"]
    header += [f"prunable (< {tolerance:g} {unit_of(metric)})", "rank stability", *([f"paper unpruned {label}"] if paper else [])]
    rows = []
    for s in snaps:
        index = min(range(len(s["fractions"])), key=lambda i: abs(s["fractions"][i] - at))
        epoch = (s["epoch"] or 0) + 1
        stab = "" if s.get("rank_stability") is None else f"{s['rank_stability']:.2f}"
        shares = [f"{100 * s['relative'][index]:.0f}%", f"{100 * s['prunable_fraction']:.0f}%"]
        row = [s.get("label") or epoch, f"{s['unpruned']:.2f}", f"{s['scores'][index]:.2f}", *shares, stab]
        rows.append([*row, paper.get(epoch, "n/a")] if paper else row)
    return "\n".join(markdown(header, rows))


def _correlation_sentence(c: dict, first: str, second: str, tail: str) -> str:
    return (
        f"Pearson r = {c['pearson_r']:.2f} (p = {c['p_value']:.3g}) between the per-head ablation differences on "
        f"`{first}` and `{second}` ({tail})."
    )


def correlation_line(study: dict) -> str:
    c = stage_of(study, "ablate").get("correlation")
    if not c:
        return "No second evaluation set was ablated."
    return _correlation_sentence(c, c["splits"][0], c["splits"][1], "paper: 0.68 MNLI matched vs mismatched, 0.56 newstest2013 vs MTNT")


def cross_file_correlation_line(first: dict, first_split: str, second: dict, second_split: str, sizes: str) -> str:
    """Pearson r between the per-head ablation differences of two result files (paper section 3.4)."""
    c = correlation(stage_of(first, "ablate")["splits"][first_split], stage_of(second, "ablate")["splits"][second_split])
    return _correlation_sentence(c, first_split, second_split, sizes)


def head_rows(result: dict, head: str) -> tuple[list[str], list[list]]:
    """One row per head of an ablation (``head``) or keep-one (``best_head``) result, layers and heads counted from 1."""
    columns = ["group", "layer", head, "score", "delta", "p_value", "significant"]
    return columns, [
        [r["group"], r["layer"] + 1, r[head] + 1, r["score"], r["delta"], r["p_value"], r["significant"]] for r in result["rows"]
    ]


def prune_rows(result: dict) -> tuple[list[str], list[list]]:
    columns = ["order", "groups", "fraction", "fraction_removed", "units_removed", "score"]
    rows = [
        [order, "+".join(result["groups"]), s["fraction"], removed_fraction(s, units_total(result)), units_removed(s), s["score"]]
        for order, v in result["orders"].items()
        for s in v["steps"]
    ]
    return columns, rows


SPEED_COLUMNS = {  # a column of speed_rows -> its value in a row of a speed result (None where a row does not say)
    "batch_size": lambda r: r["batch_size"],
    "original_ex_s": lambda r: r["original"]["examples_per_s"],
    "original_spread": lambda r: r["original"]["spread"],
    "pruned_ex_s": lambda r: r["pruned"]["examples_per_s"],
    "pruned_spread": lambda r: r["pruned"]["spread"],
    "gain": lambda r: None if is_inconclusive(r) else r["gain"],
    "verdict": lambda r: r.get("verdict"),
    "gain_low": lambda r: (r.get("gain_interval") or [None, None])[0],
    "gain_high": lambda r: (r.get("gain_interval") or [None, None])[1],
    "repeats": lambda r: r.get("repeats"),
    "load_1min": lambda r: (r.get("load_average") or [None])[0],
    "flop_ideal_gain": lambda r: r["flop_ideal_gain"],
}


def speed_rows(result: dict) -> tuple[list[str], list[list]]:
    """Rows per batch size; the gain is empty (None) where the verdict is inconclusive."""
    columns = list(SPEED_COLUMNS)
    rows = [[cell(r) for cell in SPEED_COLUMNS.values()] for r in result["rows"]]
    if len({r.get("call") for r in result["rows"]}) > 1:  # several timed calls (LM prefill, decode): their name, unit and rate
        columns = ["call", "unit", "original_units_s", "pruned_units_s", *columns]
        rows = [
            [r["call"], r["unit"], r["original"]["units_per_s"], r["pruned"]["units_per_s"], *row] for r, row in zip(result["rows"], rows)
        ]
    return columns, rows


def markdown_sections(payload: dict) -> list[str]:
    """The tables of docs/results.md that a results file holds, each under a heading (empty for other files)."""
    if payload.get("snapshots"):
        return ["### Training dynamics", "", dynamics_table(payload), ""]
    results = payload.get("results", payload)
    out = []
    ablate = stage_of(payload, "ablate")
    for split in (ablate.get("splits") or {}) if isinstance(ablate, dict) else {}:
        out += [f"### Single-head ablation on `{split}`", "", ablation_table(payload, split), ""]
    if isinstance(ablate, dict) and ablate.get("correlation"):
        out += [correlation_line(payload), ""]
    if any("best_head" in row for row in stage_of(payload, "keep_one").get("rows") or []):
        out += ["### Keep one head per layer", "", keep_one_table(payload), ""]
    prune = stage_of(payload, "prune")
    if "orders" in prune:
        unit = unit_of(prune["metric"])
        out += ["### Greedy pruning", "", prune_table(payload, unit=unit), ""]
        if prune.get("by_group"):
            out += ["### Pruning one group at a time", "", study_groups_table(payload, unit=unit), ""]
    if "points" in stage_of(payload, "pareto"):
        out += ["### Quality against speed", "", pareto_table(payload), ""]
    if "cost" in stage_of(payload, "speed"):
        out += ["### Speed", "", speed_table(payload), ""]
    return out if results else []
