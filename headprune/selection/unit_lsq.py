"""Least-squares recovery in any unit: each kind names the gates it refits (``refit_gates``), each of those kinds its fit."""

from headprune.core.units import FFN, QUERY_HEADS, refit_gates
from headprune.selection.ffn_lsq import ffn_lsq_recover
from headprune.selection.lsq import lsq_recover

REFITS = {QUERY_HEADS: lsq_recover, FFN: ffn_lsq_recover}  # the fit of each kind whose gates a kind refits


def unit_lsq_recoverer(unit="head+ffn", ridge: float = 1e-3, max_scale: float = 10.0):
    """A ``recover(model, teacher, batches)`` step in any unit: least-squares head scales, then neuron scales on the rescaled attention."""

    def recover(model, teacher, batches):
        batches = list(batches)
        for gates in refit_gates(model, unit):
            REFITS[gates.unit](model, gates, batches, teacher=teacher, ridge=ridge, max_scale=max_scale)

    return recover


def ffn_lsq_recoverer(ridge: float = 1e-3, max_scale: float = 10.0):
    """A ``recover(model, teacher, batches)`` step (``headprune.selection.schedule.iterative_prune``) for FFN neurons."""
    return unit_lsq_recoverer("ffn", ridge, max_scale)
