"""Evaluation helpers of the experiments, on the task protocol only: split checks, many masks, swapped models."""

from __future__ import annotations

from contextlib import contextmanager


def split_size(task, split: str) -> int:
    """Number of examples of a split (0 when it is missing)."""
    return int(task.split_sizes().get(split, 0))


def check_split(task, split: str, what: str = "evaluation") -> None:
    """A clear error when an evaluation split is empty or missing, before any work."""
    if split_size(task, split) == 0:
        raise ValueError(
            f"the {what} split {split!r} is empty or missing: nothing to evaluate "
            f"(check data.limit_eval / data.limits and the data files); this task's splits: {task.split_sizes()}"
        )


def selection_split(task, name: str | None = None) -> str:
    """The held-out split for choices (appendix A): ``name`` when given, else the task's own."""
    return str(name) if name else task.selection_split


def evaluate_many(task, masks: list, split: str, desc: str = "", chunk: int = 36, progress: bool = True) -> list:
    """EvalResults of many masks through the task's batched ``evaluate_many``, with a progress bar."""
    from tqdm.auto import tqdm

    results = []
    n = max(split_size(task, split), 1)
    # the bar counts masks; it moves after every data batch (a chunk of masks over n examples)
    with tqdm(
        total=len(masks),
        desc=desc or f"evaluate {split}",
        unit="mask",
        disable=not progress,
        leave=False,
        bar_format="{l_bar}{bar}| {n:.1f}/{total} masks [{elapsed}<{remaining}]",
    ) as bar:
        for start in range(0, len(masks), chunk):
            todo, done = masks[start : start + chunk], bar.n
            part = task.evaluate_many(todo, split=split, on_batch=lambda examples: bar.update(len(todo) * examples / n))
            results.extend(part)
            bar.update(done + len(part) - bar.n)  # exact count at the chunk's end
    return results


def examples_differing(first, second) -> int:
    """How many examples two EvalResults of the same split score differently (any per-example record differs)."""
    keys = [k for k in first.per_example if len(first.per_example[k]) == first.n]
    return sum(any(first.per_example[k][i] != second.per_example[k][i] for k in keys) for i in range(first.n))


@contextmanager
def swapped_model(task, model, gates):
    """Evaluate ``task`` with another model (e.g. the physically pruned copy) in place of its own."""
    own_model, own_gates = task.model, task.gates
    task.model, task.gates = model, gates
    try:
        yield task
    finally:
        task.model, task.gates = own_model, own_gates


def unit_counts(gates, groups=None) -> dict:
    """The pruning unit and how many units and query heads ``groups`` (all when None) hold."""
    groups = list(gates.groups) if groups is None else groups
    query = gates.head_mask(gates.ones())
    return {
        "unit": gates.unit,
        "units_total": sum(gates.groups[g][0] * gates.groups[g][1] for g in groups),
        "query_heads_total": sum(int(query[g].numel()) for g in groups),
    }
