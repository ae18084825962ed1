"""A task in another pruning unit (KV group, FFN neuron, block or joint): masks and scores per unit, evaluated as the task's own masks."""

from contextlib import contextmanager, nullcontext

from headprune.core.checks import pruning_unit
from headprune.core.joint import JointGates, shared_gates
from headprune.core.kinds.kind_registry import Unit, parse_unit, unit_name
from headprune.core.units import QUERY_HEADS, base_mask, model_gates, primitive_gates, unit_gates


class TaskView:
    """``task`` seen with other gates (``_gates``); everything else is the task's own."""

    def __getattr__(self, name):
        return getattr(self.task, name)

    @property
    def gates(self):
        return self._gates

    @contextmanager
    def _task_gates(self, gates):
        """Within: the task evaluates under ``gates`` (its own restored after)."""
        own = self.task.gates
        self.task.gates = gates
        try:
            yield
        finally:
            self.task.gates = own


class UnitTask(TaskView):
    """``task`` with its gates in another unit; everything else is the task's own."""

    def __init__(self, task, unit: str):
        self.__dict__["task"] = task
        self.__dict__["unit"] = unit_name(unit)
        self.__dict__["_gates"] = unit_gates(task.gates, unit)

    def __setattr__(self, name, value):
        if name == "gates":  # a swapped model's gates (speed), in any unit: the task keeps its query-head gates, seen here in this unit
            heads, _ = primitive_gates(value)
            heads = heads if heads is not None else model_gates(value.model)
            self.task.gates = heads
            self.__dict__["_gates"] = unit_gates(heads, self.unit)
        else:
            setattr(self.task, name, value)

    def _acting_gates(self):
        """The task's gates, for the duration of an evaluation, as joint gates over every kind that acts beyond query heads."""
        acting = shared_gates(self._gates)  # {kind name: the gates that act} (query heads alone for head and kv_group units)
        if set(acting) <= {QUERY_HEADS}:
            return nullcontext()
        return self._task_gates(JointGates(self.task.model, list(acting.values())))

    def _acting(self, mask):
        """A mask in this unit as the masks that act, in one dict (query heads alone: the query-head mask)."""
        return None if mask is None else base_mask(self._gates, mask)

    def evaluate(self, mask=None, split: str = "eval", on_batch=None, **options):
        """The task's evaluation of a mask in this unit; ``options`` are the task's own (``batch_size`` of NLI and LM)."""
        with self._acting_gates():
            return self.task.evaluate(self._acting(mask), split, on_batch=on_batch, **options)

    def evaluate_many(self, masks: list, split: str = "eval", on_batch=None) -> list:
        with self._acting_gates():
            return self.task.evaluate_many([self._acting(m) for m in masks], split, on_batch=on_batch)


def in_unit(task, unit="head"):
    """The task itself for ``head``, else a UnitTask whose gates, masks and scores are per ``unit``."""
    return task if unit_name(unit) == QUERY_HEADS else UnitTask(task, unit)


def unit_of(cfg) -> Unit:
    """``prune.unit`` parsed once into its ``Unit`` (the schema's ConfigError if none); a run without prune gates query heads."""
    prune = cfg.get("prune")
    return parse_unit(QUERY_HEADS) if prune is None else pruning_unit(prune.unit, "prune.unit")
