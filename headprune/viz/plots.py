"""Figures of the experiments (matplotlib, Agg backend): per-group heatmaps, pruning curves, and head importance over training."""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from headprune.engine.verdict import is_inconclusive  # noqa: E402
from headprune.results.points import point_name  # noqa: E402
from headprune.viz.tables import pareto_front, point_speed  # noqa: E402

GROUP_TITLES = {
    "enc_self": "Enc-Enc (encoder self-attention)",
    "enc_dec": "Enc-Dec (cross-attention)",
    "dec_self": "Dec-Dec (decoder self-attention)",
}


def _labelled(fig, ax, path, title: str, xlabel: str, ylabel: str, legend_size: int = 8, grid: bool = True) -> Path:
    """Label the axes, title, grid and legend of a one-axes figure, then save it."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if grid:
        ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    return _save(fig, path)


def _save(fig, path: str | Path, dpi: int = 110, bbox: str | None = "tight") -> Path:
    """Write a PNG atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=dpi, bbox_inches=bbox)
    plt.close(fig)
    tmp.replace(path)
    return path


def head_heatmaps(values: dict, title: str, label: str, significant: dict | None = None, signed: bool = True, path=None):
    """Layers x heads heatmaps per group on one scale (around 0 when ``signed``), ``significant`` starred; saved when ``path``."""
    groups = list(values)
    fig, axes = plt.subplots(1, len(groups), figsize=(4.2 * len(groups) + 1, 3.6), squeeze=False)
    arrays = [np.asarray(values[g], dtype=float) for g in groups]
    bound = max(1e-9, max(float(np.nanmax(np.abs(a))) for a in arrays))
    low, high = (-bound, bound) if signed else (min(float(np.nanmin(a)) for a in arrays), max(float(np.nanmax(a)) for a in arrays))
    image = None
    for ax, group, data in zip(axes[0], groups, arrays):
        image = ax.imshow(data, cmap="RdBu" if signed else "viridis", vmin=low, vmax=high, aspect="auto")
        ax.set_title(GROUP_TITLES.get(group, group), fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(data.shape[1]), [str(i + 1) for i in range(data.shape[1])], fontsize=7)  # heads and layers from 1
        ax.set_yticks(range(data.shape[0]), [str(i + 1) for i in range(data.shape[0])])
        if significant is not None:
            marks = np.asarray(significant[group], dtype=bool)
            for layer, head in zip(*np.nonzero(marks)):
                ax.text(head, layer, "*", ha="center", va="center", fontsize=12, color="black")
    fig.colorbar(image, ax=axes[0].tolist(), label=label, shrink=0.9)
    fig.suptitle(title, fontsize=10)
    return fig if path is None else _save(fig, path)


def pruning_curves(
    curves: dict[str, tuple[list[float], list[float]]],
    path: str | Path,
    title: str,
    ylabel: str,
    baseline: float | None = None,
    xlabel: str = "heads pruned (%)",
) -> Path:
    """Score vs fraction of heads pruned (or of the units ``xlabel`` names), one line per curve name ({name: (fractions, scores)})."""
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, (fractions, scores) in curves.items():
        ax.plot(100 * np.asarray(fractions), scores, marker="o", markersize=3, label=name)
    if baseline is not None:
        ax.axhline(baseline, color="grey", linestyle=":", linewidth=1, label="unpruned")
    return _labelled(fig, ax, path, title, xlabel, ylabel)


def pareto_figure(result: dict, path: str | Path, title: str) -> Path:
    """Score against speed-up (measured where timed, else predicted), one marker series per order+recovery, the front joined."""
    points = result["points"]
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name in dict.fromkeys(point_name(p) for p in points):
        mine = sorted((p for p in points if point_name(p) == name), key=point_speed)  # one line left to right
        style = {"marker": "*", "markersize": 9, "linestyle": ""} if name == "unpruned" else {"marker": "o", "markersize": 4}
        ax.plot([point_speed(p) for p in mine], [p["score"] for p in mine], label=name, **style)
    front = sorted(
        (point_speed(p), p["score"]) for p, best in zip(points, pareto_front(points, result.get("higher_is_better", True))) if best
    )
    ax.plot([s for s, _ in front], [q for _, q in front], color="grey", linestyle=":", linewidth=1, label="Pareto front")
    timed = any(p.get("measured") for p in points)
    return _labelled(
        fig, ax, path, title, "measured speed-up" if timed else f"predicted speed-up ({result.get('cost', 'flops')})", result["metric"]
    )


def keep_one_bars(rows: list[dict], path: str | Path, title: str, ylabel: str) -> Path:
    """Score change per layer when only the layer's best head is kept (error bars: 95% bootstrap interval)."""
    fig, ax = plt.subplots(figsize=(max(4.0, 0.45 * len(rows) + 2), 3.6))
    names = [f"{r['group']}\nL{r['layer'] + 1}" for r in rows]
    deltas = np.asarray([r["delta"] for r in rows], dtype=float)
    low = deltas - np.asarray([r["ci_low"] for r in rows], dtype=float)
    high = np.asarray([r["ci_high"] for r in rows], dtype=float) - deltas
    colors = ["tab:red" if r["significant"] else "tab:blue" for r in rows]
    ax.bar(range(len(rows)), deltas, yerr=np.vstack([low.clip(0), high.clip(0)]), color=colors, capsize=2)
    ax.set_xticks(range(len(rows)), names, fontsize=7)
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_ylabel(ylabel)
    ax.set_title(title + " (red: p < 0.01)", fontsize=10)
    return _save(fig, path)


def speed_bars(rows: list[dict], path: str | Path, title: str) -> Path:
    """Examples/s of the original and pruned models per batch size (spread as error bars), the gain or "inconclusive" above."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    x = np.arange(len(rows))
    for offset, key in ((-0.2, "original"), (0.2, "pruned")):
        ax.bar(x + offset, [r[key]["examples_per_s"] for r in rows], width=0.4, label=key, yerr=[r[key]["spread"] for r in rows], capsize=2)
    for i, r in enumerate(rows):  # the gain above each pair of bars, or "inconclusive" when it is within the noise
        if "verdict" in r:
            top = max(r[k]["examples_per_s"] + r[k]["spread"] for k in ("original", "pruned"))
            label = "inconclusive" if is_inconclusive(r) else f"{100 * r['gain']:+.0f}%"
            ax.annotate(label, (x[i], top), ha="center", va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    several = len({r.get("call") for r in rows}) > 1  # e.g. prefill and decode: name the call under each pair
    ax.set_xticks(x, [f"{r['call']} {r['batch_size']}" if several else str(r["batch_size"]) for r in rows], fontsize=7 if several else None)
    return _labelled(fig, ax, path, title, "batch size", "examples / s", grid=False)


def tradeoff_figure(
    series: dict[str, list[dict]], path: str | Path, title: str, xlabel: str, ylabel: str, references: dict[str, float] | None = None
) -> Path:
    """Quality (lower is better) against speed per series, each series' Pareto front joined, points labelled, ``references`` as lines."""
    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    for name, rows in series.items():
        points = [{"score": r["score"], "predicted_speedup": r["speed"]} for r in rows]
        front = sorted((r["speed"], r["score"]) for r, best in zip(rows, pareto_front(points, higher_is_better=False)) if best)
        line = ax.plot([s for s, _ in front], [q for _, q in front], linestyle="-", linewidth=1)[0]
        ax.scatter([r["speed"] for r in rows], [r["score"] for r in rows], color=line.get_color(), s=18, label=name, zorder=3)
        for r in rows:
            ax.annotate(r["label"], (r["speed"], r["score"]), fontsize=6, xytext=(3, 3), textcoords="offset points")
    for label, score in (references or {}).items():
        ax.axhline(score, color="grey", linestyle=":", linewidth=1, label=label)
    return _labelled(fig, ax, path, title, xlabel, ylabel, legend_size=7)


# ---- training dynamics (the paper's Figure 4) ---------------------------------------------------


def snapshot_label(snap: dict) -> str:
    """A snapshot's name in figures: its checkpoint's step (``step 1000``) or its training epoch (``epoch 3``)."""
    if snap.get("label"):
        return str(snap["label"])
    return f"epoch {snap['epoch'] + 1 if snap.get('epoch') is not None else '?'}"


def importance_heatmaps(importance: dict, title: str = "head importance"):
    """One layer x head heatmap per attention group, on one colour scale."""
    return head_heatmaps(importance, title, "importance", signed=False)


def pruning_curves_by_epoch(snapshots: list[dict], path) -> Path:
    """Figure 4: score relative to the epoch's unpruned score vs fraction pruned, one curve per epoch."""
    fig, ax = plt.subplots(figsize=(6, 4.2))
    colors = plt.cm.viridis(np.linspace(0, 1, max(len(snapshots), 2)))
    for color, snap in zip(colors, snapshots):
        label = f"{snapshot_label(snap)} ({snap['unpruned']:.1f})"
        ax.plot(np.asarray(snap["fractions"]) * 100, np.asarray(snap["relative"]) * 100, marker="o", ms=3, color=color, label=label)
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel(f"{snapshots[0]['metric']} relative to unpruned (%)")
    ax.set_title("pruning curve across training (greedy by importance)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return _save(fig, path, dpi=130, bbox=None)


def importance_over_time(snapshots: list[dict], path) -> Path:
    """Each head's importance across snapshots (rows: heads of all groups, columns: snapshots)."""
    rows, labels = [], []
    for group in snapshots[0]["importance"]:
        stacked = np.stack([np.asarray(s["importance"][group]) for s in snapshots], axis=-1)  # (layers, heads, snapshots)
        rows += list(stacked.reshape(-1, len(snapshots)))  # layer-major, as the labels
        labels += [f"{group} {layer}.{head}" for layer in range(stacked.shape[0]) for head in range(stacked.shape[1])]
    values = np.asarray(rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, max(3.5, 0.08 * len(rows) + 1.5)), gridspec_kw={"width_ratios": [2, 1]})
    image = axes[0].imshow(values, aspect="auto", cmap="magma")
    for ax in axes:
        ax.set_xlabel("snapshot")
        ax.set_xticks(range(len(snapshots)), [snapshot_label(s) for s in snapshots], fontsize=7, rotation=45)
    axes[0].set_ylabel("head (group layer.head)")
    step = max(1, len(labels) // 24)
    axes[0].set_yticks(range(0, len(labels), step), labels[::step], fontsize=6)
    axes[0].set_title("head importance over training")
    fig.colorbar(image, ax=axes[0], fraction=0.046)
    epochs = list(range(len(snapshots)))
    axes[1].plot(epochs, [s["prunable_fraction"] * 100 for s in snapshots], marker="o", label="prunable (%)")
    stability = [s.get("rank_stability") for s in snapshots]
    if any(v is not None for v in stability):
        axes[1].plot(epochs[1:], [100 * (v or 0) for v in stability[1:]], marker="s", label="rank stability (Spearman x100)")
    axes[1].set_title("prunability and rank stability")
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, path, dpi=130, bbox=None)
