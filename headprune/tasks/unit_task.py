"""A task in another pruning unit: the same task whose masks and scores are per KV group (``prune.unit=kv_group``).

Every experiment then runs unchanged on KV groups: its shapes come from ``task.gates.groups`` and its
masks reach the task's own evaluation as query-head masks (``KVGroupGates.head_mask``).
"""

from __future__ import annotations

from headprune.core.units import QUERY_HEADS, unit_gates


class UnitTask:
    """``task`` with its gates in another unit; everything else is the task's own."""

    def __init__(self, task, unit: str):
        self.__dict__["task"] = task
        self.__dict__["unit"] = unit
        self.__dict__["_gates"] = unit_gates(task.gates, unit)

    def __getattr__(self, name):
        return getattr(self.task, name)

    def __setattr__(self, name, value):
        if name == "gates":  # a swapped model's gates (speed), in either unit: the task keeps HeadGates, seen here in this unit
            heads = value if value.unit == "head" else value.heads
            self.task.gates = heads
            self.__dict__["_gates"] = unit_gates(heads, self.unit)
        else:
            setattr(self.task, name, value)

    @property
    def gates(self):
        return self._gates

    def evaluate(self, mask=None, split: str = "eval", on_batch=None):
        return self.task.evaluate(None if mask is None else self._gates.head_mask(mask), split, on_batch=on_batch)

    def evaluate_many(self, masks: list, split: str = "eval", on_batch=None) -> list:
        return self.task.evaluate_many([None if m is None else self._gates.head_mask(m) for m in masks], split, on_batch)


def in_unit(task, unit: str = "head"):
    """The task itself for ``head``, else a UnitTask whose gates, masks and scores are per ``unit``."""
    return task if unit == "head" else UnitTask(task, unit)


def unit_of(cfg) -> str:
    """``prune.unit``; a run without a prune group (training) gates the model's query heads."""
    return str(cfg.prune.unit) if cfg.get("prune") is not None else QUERY_HEADS
