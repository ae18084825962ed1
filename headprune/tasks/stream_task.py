"""A task whose units are streamed instead of removed (``prune.action=stream``): its gates are ``StreamGates``."""

from headprune.core.stream_gates import StreamGates
from headprune.tasks.unit_task import TaskView, in_unit, unit_of

REMOVE, STREAM = "remove", "stream"


def action_of(cfg) -> str:
    """``prune.action``: what a gate at 0 does to a unit (a run without a prune group removes)."""
    prune = cfg.get("prune")
    return REMOVE if prune is None or prune.get("action") is None else str(prune.action)


def task_context(data) -> int | None:
    """The longest context of the task's data in tokens: ``data.max_length`` or the largest ``data.context_lengths`` (None: neither)."""
    lengths = data.get("context_lengths")
    if lengths is not None:
        values = [lengths] if isinstance(lengths, int) else list(lengths)
        return max(int(v) for v in values) if values else None
    length = data.get("max_length")
    return int(length) if length is not None else None


class StreamTask(TaskView):
    """``task`` with StreamGates in place of its head gates; everything else is the task's own."""

    def __init__(self, task, gates: StreamGates, context_tokens: int | None):
        self.__dict__["task"] = task
        self.__dict__["_gates"] = gates
        self.__dict__["context_tokens"] = context_tokens  # the task's longest context: where the KV cache is counted

    def __setattr__(self, name, value):
        if name == "gates":
            raise ValueError("a streaming task keeps its model: streamed units keep their weights, no pruned copy replaces it")
        setattr(self.task, name, value)

    def evaluate(self, mask=None, split: str = "eval", on_batch=None):
        if mask is None:  # nothing streamed: the model as it is, without computing the streamed branch it would not use
            return self.task.evaluate(None, split, on_batch=on_batch)
        with self._task_gates(self._gates):  # its own head gates stay on the model, unset
            return self.task.evaluate(mask, split, on_batch=on_batch)

    def evaluate_many(self, masks: list, split: str = "eval", on_batch=None) -> list:
        with self._task_gates(self._gates):
            return self.task.evaluate_many(masks, split, on_batch)


def in_action(task, cfg):
    """The task in ``prune.unit`` (headprune.tasks.unit_task.in_unit), or with StreamGates in that unit for ``prune.action=stream``."""
    unit = unit_of(cfg)
    if action_of(cfg) != STREAM:
        return in_unit(task, unit)
    stream = cfg.prune.stream
    gates = StreamGates(task.gates, int(stream.sink), int(stream.window), unit=unit.name)
    return StreamTask(task, gates, task_context(cfg.data))
