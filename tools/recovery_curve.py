"""Perplexity against recovery tokens, pruned models beside their control, from a prune run's fine-tune logs.

Each fine-tune makes one pass over its token budget, and a step's task loss is computed on its batch before the
update that batch drives: the loss of step t is an estimate on text the model has not trained on (progressive
validation). Windows of ``--window`` steps give exp(mean task loss), the perplexity the model had reached after
that many tokens; the ratio to the control's at the same step (the same batches) is how far recovery is.

    python tools/recovery_curve.py <prune run dir> docs/results/<name>.png [--window 10]
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from pathlib import Path

TASK = "/task"  # Lightning CSV columns recover/<label>/task: the cross-entropy on the batch's real tokens


def task_losses(run_dir: Path) -> dict[str, list[float]]:
    """{fine-tune label: task loss per step} from every metrics.csv of the run's CSV logger."""
    losses: dict[str, dict[int, float]] = {}
    for path in sorted(run_dir.glob("csv/version_*/metrics.csv")):
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                for column, value in row.items():
                    if column.startswith("recover/") and column.endswith(TASK) and value:
                        label = column[len("recover/") : -len(TASK)]
                        losses.setdefault(label, {})[int(row["step"])] = float(value)
    return {label: [steps[s] for s in sorted(steps)] for label, steps in losses.items()}


def tokens_per_step(run_dir: Path) -> float:
    """Mean real input tokens per fine-tune step (the run's first round)."""
    results = json.loads((run_dir / "results.json").read_text())["results"]
    first = results["finetune"]["rounds"][0]
    return first["tokens"] / first["steps"]


def windows(losses: list[float], size: int) -> list[tuple[int, float]]:
    """(last step of the window, exp(mean loss of the window)) for consecutive windows of ``size`` steps."""
    return [
        (min(start + size, len(losses)), math.exp(sum(losses[start : start + size]) / len(losses[start : start + size])))
        for start in range(0, len(losses), size)
    ]


def curve_table(curves: dict[str, list[tuple[int, float]]], per_step: float) -> str:
    """Markdown: tokens seen, each label's windowed perplexity and, beside the control, its ratio to the control."""
    labels = [label for label in curves if label != "control"]
    lines = [
        "| tokens seen | "
        + " | ".join(f"`{label}`" for label in labels)
        + " | control | "
        + " | ".join(f"`{label}` / control" for label in labels)
        + " |",
        "|---:|" + "---:|" * (2 * len(labels) + 1),
    ]
    for index, (step, control) in enumerate(curves["control"]):
        values = [curves[label][index][1] for label in labels]
        lines.append(
            f"| {step * per_step:,.0f} | "
            + " | ".join(f"{v:.1f}" for v in values)
            + f" | {control:.1f} | "
            + " | ".join(f"{v / control:.2f}" for v in values)
            + " |"
        )
    return "\n".join(lines)


def curve_figure(curves: dict[str, list[tuple[int, float]]], per_step: float, path: Path, title: str) -> Path:
    """Windowed perplexity against tokens seen, one line per fine-tune (the control dashed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, points in curves.items():
        style = "--" if label == "control" else "-"
        ax.plot([s * per_step for s, _ in points], [v for _, v in points], style, marker="o", markersize=3, label=label)
    ax.set_xlabel("recovery tokens seen")
    ax.set_ylabel("perplexity on the next batches (before their update)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("figure", type=Path)
    parser.add_argument("--window", type=int, default=10, help="steps per window")
    args = parser.parse_args(argv)
    losses = task_losses(args.run_dir)
    if "control" not in losses:
        raise SystemExit(f"{args.run_dir} has no control fine-tune in its CSV logs (prune.control=true logger=csv)")
    curves = {label: windows(values, args.window) for label, values in losses.items()}
    per_step = tokens_per_step(args.run_dir)
    print(curve_table(curves, per_step))
    print(f"figure: {curve_figure(curves, per_step, args.figure, 'Recovery: pruned models and their control')}")


if __name__ == "__main__":
    main()
