"""Figures for training dynamics: the paper's Figure 4 and importance over time."""

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def snapshot_label(snap: dict) -> str:
    """A snapshot's name in figures: its checkpoint's step (``step 1000``) or its training epoch (``epoch 3``)."""
    if snap.get("label"):
        return str(snap["label"])
    return f"epoch {snap['epoch'] + 1 if snap.get('epoch') is not None else '?'}"


def importance_heatmaps(importance: dict, title: str = "head importance"):
    """One layer x head heatmap per attention group."""
    groups = list(importance)
    fig, axes = plt.subplots(1, len(groups), figsize=(3.6 * len(groups), 3.2), squeeze=False)
    for ax, group in zip(axes[0], groups):
        values = np.asarray(importance[group], dtype=float)
        image = ax.imshow(values, cmap="viridis", aspect="auto")
        ax.set_title(group)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_xticks(range(values.shape[1]))
        ax.set_yticks(range(values.shape[0]))
        fig.colorbar(image, ax=ax, fraction=0.046)
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def pruning_curves_by_epoch(snapshots: list[dict], path) -> None:
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
    fig.savefig(path, dpi=130)
    plt.close(fig)


def importance_over_time(snapshots: list[dict], path) -> None:
    """Each head's importance across snapshots (rows: heads of all groups, columns: snapshots)."""
    rows, labels = [], []
    for group in snapshots[0]["importance"]:
        layers = np.asarray(snapshots[0]["importance"][group]).shape[0]
        for layer in range(layers):
            for head in range(np.asarray(snapshots[0]["importance"][group]).shape[1]):
                rows.append([np.asarray(s["importance"][group])[layer, head] for s in snapshots])
                labels.append(f"{group} {layer}.{head}")
    values = np.asarray(rows)
    fig, axes = plt.subplots(1, 2, figsize=(10, max(3.5, 0.08 * len(rows) + 1.5)), gridspec_kw={"width_ratios": [2, 1]})
    image = axes[0].imshow(values, aspect="auto", cmap="magma")
    axes[0].set_xlabel("snapshot")
    axes[0].set_xticks(range(len(snapshots)))
    axes[0].set_xticklabels([snapshot_label(s) for s in snapshots], fontsize=7, rotation=45)
    axes[0].set_ylabel("head (group layer.head)")
    step = max(1, len(labels) // 24)
    axes[0].set_yticks(range(0, len(labels), step))
    axes[0].set_yticklabels(labels[::step], fontsize=6)
    axes[0].set_title("head importance over training")
    fig.colorbar(image, ax=axes[0], fraction=0.046)
    epochs = list(range(len(snapshots)))
    axes[1].plot(epochs, [s["prunable_fraction"] * 100 for s in snapshots], marker="o", label="prunable (%)")
    stability = [s.get("rank_stability") for s in snapshots]
    if any(v is not None for v in stability):
        axes[1].plot(epochs[1:], [100 * (v or 0) for v in stability[1:]], marker="s", label="rank stability (Spearman x100)")
    axes[1].set_xlabel("snapshot")
    axes[1].set_xticks(epochs)
    axes[1].set_xticklabels([snapshot_label(s) for s in snapshots], fontsize=7, rotation=45)
    axes[1].set_title("prunability and rank stability")
    axes[1].grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
