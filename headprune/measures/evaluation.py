"""Evaluation helpers of the experiments, on the task protocol only: split checks, many masks, swapped models."""

from contextlib import contextmanager

from headprune.core.unit_kinds import block_group
from headprune.core.units import model_gates, query_heads_of


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


def evaluate_one(task, mask, split: str, desc: str, *, progress: bool):
    """The EvalResult of one mask (None: the model as it is) on ``split``, with a progress bar over its examples."""
    from tqdm.auto import tqdm

    with tqdm(
        total=split_size(task, split),
        desc=f"{desc} ({split})",
        disable=not progress,
        leave=False,
        bar_format="{l_bar}{bar}| {n:.0f}/{total} examples [{elapsed}<{remaining}]",
    ) as bar:
        return task.evaluate(mask, split=split, on_batch=lambda examples: bar.update(min(examples, bar.total - bar.n)))


def evaluate_many(task, masks: list, split: str, desc: str = "", chunk: int = 36, *, progress: bool) -> list:
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

            def moved(examples, todo=todo, done=done):  # never past the chunk's end (float shares add up to a hair more)
                bar.update(min(len(todo) * examples / n, done + len(todo) - bar.n))

            part = task.evaluate_many(todo, split=split, on_batch=moved)
            results.extend(part)
            bar.update(done + len(part) - bar.n)  # exact count at the chunk's end
    return results


SCORE_RTOL = 1e-6  # a masked and a physically pruned model differ by float rounding only: relative 1e-6 of each quantity


def _differs(first: list, second: list, rtol: float) -> list[bool]:
    """Per example: does a record differ? Numbers within ``rtol`` of the record's mean magnitude agree; others must be equal."""
    if not all(isinstance(v, float) for v in first + second):
        return [a != b for a, b in zip(first, second)]  # discrete: labels, counts, translations
    scale = max(sum(abs(v) for v in first) / max(len(first), 1), 1e-30)
    return [abs(a - b) > rtol * max(abs(a), abs(b), scale) for a, b in zip(first, second)]


def score_check(masked, pruned, rtol: float = SCORE_RTOL) -> dict:
    """Do a masked and a pruned model's EvalResults agree? The score within ``rtol`` (relative), each example's records too."""
    records = [(masked.per_example[k], pruned.per_example[k]) for k in masked.per_example if len(masked.per_example[k]) == masked.n]
    beyond = [any(flags) for flags in zip(*(_differs(first, second, rtol) for first, second in records))]
    not_identical = sum(any(first[i] != second[i] for first, second in records) for i in range(masked.n))  # bit for bit
    close = abs(masked.score - pruned.score) <= rtol * max(abs(masked.score), abs(pruned.score), 1e-12)
    return {
        "metric": masked.metric,
        "masked": masked.score,
        "pruned": pruned.score,
        "equal": bool(masked.score == pruned.score and not_identical == 0),  # bit for bit
        "examples_differing": int(sum(beyond)),  # beyond the tolerance
        "examples_not_identical": int(not_identical),
        "tolerance": rtol,
        "agree": bool(close and not any(beyond)),
    }


def score_check_text(check: dict) -> str:
    """One line: the masked and pruned scores and whether they agree (bit for bit, within the tolerance, or not)."""
    how = (
        "identical"
        if check["equal"]
        else f"agree within relative {check['tolerance']:g} ({check['examples_not_identical']} examples differ by float rounding only)"
        if check["agree"]
        else f"differ beyond relative {check['tolerance']:g} ({check['examples_differing']} examples)"
    )
    return f"score check ({check['metric']}): masked {check['masked']:.8g}, pruned {check['pruned']:.8g}: {how}"


@contextmanager
def swapped_model(task, model, gates=None):
    """Evaluate ``task`` with another model (e.g. the physically pruned copy) in place of its own, under ``gates`` (default: its own)."""
    own_model, own_gates = task.model, task.gates
    task.model, task.gates = model, model_gates(model) if gates is None else gates
    try:
        yield task
    finally:
        task.model, task.gates = own_model, own_gates


def unit_counts(gates, groups=None) -> dict:
    """The pruning unit and how many units and query heads ``groups`` (all when None) hold; a block counts its attention's query heads."""
    groups = list(gates.groups) if groups is None else groups
    query = query_heads_of(gates, gates.ones())
    return {
        "unit": gates.unit,
        "units_total": sum(gates.groups[g][0] * gates.groups[g][1] for g in groups),
        "query_heads_total": sum(int(m.numel()) for g, m in query.items() if g in groups or block_group(g) in groups),
    }
