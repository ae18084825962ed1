"""The deployer's table of pruning in several units: each run's recovered point beside its control, in PyTorch and ONNX.

Rows: the unpruned model, the control (the unpruned model given the same fine-tune), then one recovered point per
prune run (heads, FFN neurons, both), with the heads and neurons it keeps, its FLOP-ideal speed-up, its accuracy in
PyTorch (the prune run's score) and in ONNX Runtime f32 / int8 (``tools/onnx_numbers.py``), and its drop against the
control in each runtime.
"""

from __future__ import annotations

import json
import math

from headprune.results.points import fine_tuned, kind_counts, point_name
from headprune.scoring.sample_intervals import mcnemar_exact, wilson_interval


def _recovered(payload: dict) -> dict:
    """The one fine-tuned, non-control point of a prune run."""
    (point,) = [p for p in payload["results"]["points"] if p.get("recovery") == "finetune" and not p.get("control")]
    return point


def _control(payload: dict) -> dict:
    (point,) = [p for p in payload["results"]["points"] if p.get("control")]
    return point


def _kept(point: dict, unit, totals: dict[str, int]) -> dict[str, int]:
    """{"head": kept, "ffn": kept} of a point's mask, the kinds it does not prune kept whole."""
    removed = {kind: gone for kind, (gone, _) in kind_counts(point["mask"], unit).items()}
    return {kind: total - removed.get(kind, 0) for kind, total in totals.items()}


def onnx_accuracies(model: dict) -> tuple[float, float, float, float]:
    """PyTorch, ONNX f32 (largest batch), ONNX int8 at the smallest and the largest batch of one onnx_numbers model."""
    acc = model["accuracy"]
    f32 = acc["onnx f32"][max(acc["onnx f32"], key=int)]
    int8 = acc["onnx int8"]
    return acc["torch"], f32, int8[min(int8, key=int)], int8[max(int8, key=int)]


def units_deploy_table(runs: dict[str, tuple[dict, str]], onnx: dict, base: str = "unpruned", control: str = "control") -> str:
    """``runs``: {row label: (prune run payload, its model's name in ``onnx``)}; ``onnx``: onnx_numbers' result, holding
    ``base`` and ``control`` too. Each point's PyTorch score must be the one onnx_numbers measured (a ValueError else)."""
    models = onnx["models"]
    totals = {"head": models[base]["heads"], "ffn": models[base]["neurons"]}
    int8_sizes = sorted(models[base]["accuracy"]["onnx int8"], key=int)
    lines = [
        "| model | heads kept | neurons kept | FLOP-ideal speed-up | PyTorch | ONNX f32 | "
        + " | ".join(f"ONNX int8, batch {s}" for s in (int8_sizes[0], int8_sizes[-1]))
        + " | control (PyTorch) | vs control: PyTorch / f32 / int8 batch "
        + f"{int8_sizes[-1]} |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]

    def cells(model: dict) -> list[str]:
        return [f"{a:.2f}" for a in onnx_accuracies(model)]

    for label, name in (("unpruned", base), ("unpruned + same training (control)", control)):
        row = [label, str(models[name]["heads"]), str(models[name]["neurons"]), "1.00x", *cells(models[name]), "", ""]
        lines.append("| " + " | ".join(row) + " |")
    ctl_torch, ctl_f32, _, ctl_int8 = onnx_accuracies(models[control])
    controls = []
    for label, (payload, name) in runs.items():
        point, own_control = _recovered(payload), _control(payload)
        kept = _kept(point, payload["results"]["unit"], totals)
        model = models[name]
        if (model["heads"], model["neurons"]) != (kept["head"], kept["ffn"]):
            raise ValueError(f"{label}: the ONNX model {name} keeps {model['heads']} heads / {model['neurons']} neurons, its mask {kept}")
        torch_score, f32, int8_small, int8_large = onnx_accuracies(model)
        if abs(torch_score - point["score"]) > 1e-6:
            raise ValueError(f"{label}: onnx_numbers scored {torch_score} in PyTorch, the prune run {point['score']}")
        controls.append(own_control["score"])
        drops = f"{point['score'] - own_control['score']:+.2f} / {f32 - ctl_f32:+.2f} / {int8_large - ctl_int8:+.2f}"
        row = [
            f"{label}: {point_name(point)}@{point['step']}",
            str(kept["head"]),
            str(kept["ffn"]),
            f"{point['predicted_speedup']:.2f}x",
            *cells(model),
            f"{own_control['score']:.2f}",
            drops,
        ]
        lines.append("| " + " | ".join(row) + " |")
    same = all(abs(c - ctl_torch) < 1e-6 for c in controls)
    lines += [
        "",
        f"Accuracy on `{payload['results']['split']}` ({payload['results']['n_examples']} examples). "
        + (
            f"Each run's control scores {ctl_torch:.2f} in PyTorch, as the control model measured in ONNX Runtime does."
            if same
            else f"The runs' controls score {', '.join(f'{c:.2f}' for c in controls)} in PyTorch; the ONNX control scores {ctl_torch:.2f}."
        ),
    ]
    return "\n".join(lines)


def gain_cell(cell: dict) -> str:
    """``+69.1% [+60.1, +78.2]``: a paired gain with its 95% interval (``inconclusive`` where the verdict says so)."""
    low, high = cell["gain_interval"]
    text = f"{100 * cell['gain']:+.1f}% [{100 * low:+.1f}, {100 * high:+.1f}]"
    return text if cell["verdict"] == "confident" else f"{text} ({cell['verdict']})"


def units_speed_table(speed: dict, labels: dict[str, str], base: str = "unpruned") -> str:
    """Throughput of ``tools/onnx_numbers.py --no-accuracy``: one row per model and runtime, examples/s at each batch size
    with the paired gain over the unpruned model in PyTorch and in ONNX int8. ``labels``: {model name: row label}."""
    sizes = sorted(speed["throughput"], key=int)
    head = ["model", "runtime"]
    for size in sizes:
        head += [f"batch {size}: ex/s", "vs unpruned PyTorch", "vs unpruned ONNX int8"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (3 * len(sizes))]
    for name, label in labels.items():
        for runtime, shown in (("torch", "PyTorch"), ("onnx f32", "ONNX f32"), ("onnx int8", "ONNX int8")):
            row = [label, shown]
            for size in sizes:
                cell = speed["throughput"][size][f"{name} {runtime}"]
                own_torch = name == base and runtime == "torch"
                own_int8 = name == base and runtime == "onnx int8"
                row += [
                    f"{cell['examples_per_s']:.1f}",
                    "" if own_torch else gain_cell(cell[f"vs {base} torch"]),
                    "" if own_int8 or name == base else gain_cell(cell[f"vs {base} onnx int8"]),
                ]
            lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


KIND_COLUMNS = (("head", "heads kept"), ("ffn", "neurons kept"), ("hidden", "channels kept"))


def paired_difference(first: list[int], second: list[int]) -> dict:
    """Accuracy points of ``first`` against ``second`` on the same examples: the mean per-example difference with its paired
    95% interval (mean +- 1.96 sd / sqrt(n)) and McNemar's exact p."""
    n = len(first)
    diffs = [a - b for a, b in zip(first, second)]
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / max(n - 1, 1))
    half = 1.96 * sd / math.sqrt(n)
    p = mcnemar_exact(first, second)["p_value"]
    return {"difference": 100 * mean, "low": 100 * (mean - half), "high": 100 * (mean + half), "paired": True, "p_value": p}


def unpaired_difference(score: float, other: float, n: int) -> dict:
    """Accuracy points against another model on the same n examples, with the unpaired 95% interval of a difference of two
    proportions (wider than a paired one: the runs keep no per-example predictions)."""
    p, q = score / 100, other / 100
    half = 1.96 * math.sqrt((p * (1 - p) + q * (1 - q)) / n) * 100
    return {"difference": score - other, "low": score - other - half, "high": score - other + half, "paired": False}


def interval_text(difference: dict) -> str:
    """``-0.51 [-1.02, +0.00]``: a difference with its 95% interval."""
    return f"{difference['difference']:+.2f} [{difference['low']:+.2f}, {difference['high']:+.2f}]"


def difference_text(difference: dict) -> str:
    """The table's cell: the interval, and McNemar's p where the difference is paired."""
    text = interval_text(difference)
    return f"{text}, McNemar p = {difference['p_value']:.2g}" if difference["paired"] else text


def _accuracy(score: float, n: int) -> str:
    """``73.61 [72.73, 74.48]``: an accuracy with its Wilson 95% interval on n examples."""
    low, high = wilson_interval(round(score * n / 100), n)
    return f"{score:.2f} [{100 * low:.2f}, {100 * high:.2f}]"


def _recipe(payload: dict) -> str:
    """A run's fine-tune settings (prune.finetune) as one key: controls trained alike are the same control."""
    return json.dumps(payload["config"]["prune"]["finetune"], sort_keys=True)


def _totals(payloads: list[dict]) -> dict[str, int]:
    """{kind: units in all} over the runs' masks."""
    totals: dict[str, int] = {}
    for payload in payloads:
        for point in [p for p in payload["results"]["points"] if "mask" in p]:
            for kind, (_, total) in kind_counts(point["mask"], payload["results"]["unit"]).items():
                totals[kind] = max(totals.get(kind, 0), total)
    return totals


def trained_unit_rows(runs: list[tuple[str, dict]]) -> list[dict]:
    """The rows of the unit table after the unpruned one, per prune run ((row label, payload) pairs): each fine-tuned point
    against the run's control (or a control of the same fine-tune), the others against the unpruned model. Each row:
    {run (index in runs), name, point, kept ({kind: units}), against, difference (paired_difference or
    unpaired_difference), borrowed (a control of another run)}."""
    payloads = [payload for _, payload in runs]
    totals = _totals(payloads)
    n = payloads[0]["results"]["n_examples"]
    base = payloads[0]["results"]["base_score"]
    shown_controls: list[float] = []
    shared: dict[str, dict] = {}  # {fine-tune recipe: the first control trained with it}: a run without its own meets it
    for payload in payloads:
        for point in (p for p in payload["results"]["points"] if p.get("control")):
            shared.setdefault(_recipe(payload), point)
    unpruned = next((p for p in payloads[0]["results"]["points"] if p["order"] == "unpruned" and not p.get("control")), None)
    rows = []
    for index, (label, payload) in enumerate(runs):
        results = payload["results"]
        if results["n_examples"] != n or abs(results["base_score"] - base) > 1e-9:
            raise ValueError(
                f"{label}: scored on {results['n_examples']} examples from a base of {results['base_score']}, not {n} / {base}"
            )
        own = [p for p in results["points"] if p.get("control")]
        controls = own or ([shared[_recipe(payload)]] if _recipe(payload) in shared else [])
        for point in results["points"]:
            if point["order"] == "unpruned" and not point.get("control"):
                continue
            if point.get("control") and any(abs(point["score"] - c) < 1e-9 for c in shown_controls):
                continue  # the same control as a run above (the same fine-tune of the same model)
            shown_controls += [point["score"]] if point.get("control") else []
            removed = {kind: gone for kind, (gone, _) in kind_counts(point.get("mask", {}), results["unit"]).items()}
            tuned = fine_tuned(point)
            against, other = ("control", controls[0]["score"]) if tuned and controls else ("unpruned", base)
            name = "unpruned + same training (control)" if point.get("control") else f"{label}: {point_name(point)}@{point['step']}"
            reference = (controls[0] if against == "control" else unpruned) if not point.get("control") else unpruned
            paired = "correct" in point.get("per_example", {}) and "correct" in (reference or {}).get("per_example", {})
            difference = (
                paired_difference(point["per_example"]["correct"], reference["per_example"]["correct"])
                if paired
                else unpaired_difference(point["score"], other if not point.get("control") else base, n)
            )
            rows.append(
                {
                    "run": index,
                    "name": name,
                    "point": point,
                    "kept": {kind: total - removed.get(kind, 0) for kind, total in totals.items()},
                    "against": "unpruned" if point.get("control") else against,
                    "difference": difference,
                    "borrowed": tuned and bool(controls) and not own,
                }
            )
    return rows


def trained_units_table(runs: list[tuple[str, dict]]) -> str:
    """The unit table in PyTorch (trained_unit_rows): kept units per kind, FLOP-ideal speed-up, accuracy with n, difference."""
    payloads = [payload for _, payload in runs]
    totals = _totals(payloads)
    columns = [(kind, title) for kind, title in KIND_COLUMNS if kind in totals]
    n = payloads[0]["results"]["n_examples"]
    lines = [
        "| model | " + " | ".join(title for _, title in columns) + " | FLOP-ideal speed-up | accuracy [95%] | against | difference [95%] |",
        "|---|" + "---:|" * len(columns) + "---:|---:|---|---:|",
    ]
    base = payloads[0]["results"]["base_score"]
    lines.append(f"| unpruned | {' | '.join(str(totals[k]) for k, _ in columns)} | 1.00x | {_accuracy(base, n)} |  |  |")
    rows = trained_unit_rows(runs)
    for row in rows:
        point = row["point"]
        kept = " | ".join(str(row["kept"][kind]) for kind, _ in columns)
        lines.append(
            f"| {row['name']} | {kept} | {point['predicted_speedup']:.2f}x | {_accuracy(point['score'], n)} | "
            f"{row['against']} | {difference_text(row['difference'])} |"
        )
    paired = any(row["difference"]["paired"] for row in rows)
    kinds = "paired with McNemar's exact test where a run kept per-example outcomes, else unpaired" if paired else "unpaired"
    lines += ["", f"Accuracy on `{payloads[0]['results']['split']}` ({n} examples); intervals: Wilson (accuracy), {kinds} (difference)."]
    if any(row["borrowed"] for row in rows):
        lines[-1] += (
            " A fine-tuned run without a control of its own is set against the control of a run with its fine-tune settings (the same "
            "fine-tune of the same model)."
        )
    return "\n".join(lines)
