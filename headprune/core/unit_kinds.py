"""The kinds of pruning unit, and joint units that rank several kinds under one budget.

A kind says which part of every transformer layer it prunes and how one of its units is called:

    head      attention   a query head
    kv_group  attention   a KV head with all of its query heads
    ffn       ffn         an intermediate neuron of a feed-forward block
    block     both        a layer's whole attention block, or its whole feed-forward block

A unit is one kind (``"ffn"``) or a joint list of kinds covering different parts (``"head+ffn"``,
``["kv_group", "ffn"]``): its masks hold the groups of each kind side by side, and a group's name says
its kind: attention groups (``enc_self``, ``enc_dec``, ``dec_self``: heads, or KV groups when the unit
says ``kv_group``), FFN groups (``enc_ffn``, ``dec_ffn``) and block groups (``<group>_block``, one unit
per layer).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from headprune.core.families import GROUPS
from headprune.core.mlp_layouts import FFN_GROUPS

JOINER = "+"  # "head+ffn": the kinds of a joint unit in one string
BLOCK_SUFFIX = "_block"  # "dec_self_block", "dec_ffn_block": a layer's whole sub-block


@dataclass(frozen=True)
class UnitKind:
    """One kind of pruning unit: the parts of a layer it prunes, what one unit is called, whether ablating one is useful."""

    name: str
    parts: tuple[str, ...]  # "attention", "ffn": the sub-blocks whose units it removes
    noun: str  # one unit, in messages
    ablation: str | None = None  # why removing one unit at a time is no useful order (None: it is one)


NEURON_ABLATION = (
    "removing one FFN neuron at a time is no useful pruning order: a feed-forward block holds hundreds to thousands of "
    "neurons, each alone moves the output by a small share of its block, below the noise of an evaluation split, "
    "and the order would need one evaluation per neuron; score neurons from gradients instead (prune.order=importance "
    "or fisher: one backward pass for all of them)"
)

KINDS: dict[str, UnitKind] = {
    kind.name: kind
    for kind in (
        UnitKind("head", ("attention",), "head"),
        UnitKind("kv_group", ("attention",), "KV group"),
        UnitKind("ffn", ("ffn",), "neuron", ablation=NEURON_ABLATION),
        UnitKind("block", ("attention", "ffn"), "block"),
    )
}


def unit_kinds(unit) -> tuple[str, ...]:
    """The kinds of a unit, in the registry's order: ``"head+ffn"`` or ``["ffn", "head"]`` -> ("head", "ffn").

    A ValueError names an unknown kind, a kind given twice, or kinds that prune the same part (head with kv_group,
    block with anything else).
    """
    if not isinstance(unit, str) and not (isinstance(unit, Iterable) and all(isinstance(k, str) for k in unit)):
        raise ValueError(
            f"a unit is a kind's name or a list of names, e.g. 'head' or ['kv_group', 'ffn']; got {type(unit).__name__} {unit!r:.40}"
        )
    names = unit.split(JOINER) if isinstance(unit, str) else [str(k) for k in unit]
    names = [n.strip() for n in names]
    unknown = [n for n in names if n not in KINDS]
    if unknown or not names:
        raise ValueError(
            f"unknown pruning unit {unit!r}: give one of {list(KINDS)} or a joint list of kinds that prune different "
            f"parts, e.g. [head, ffn] or [kv_group, ffn] (written head+ffn)"
        )
    if len(set(names)) != len(names):
        raise ValueError(f"pruning unit {unit!r} names a kind twice")
    taken: dict[str, str] = {}
    for name in names:
        for part in KINDS[name].parts:
            if part in taken:
                raise ValueError(
                    f"pruning unit {unit!r} joins {taken[part]} and {name}, which both prune the {part} blocks: a joint unit "
                    "joins kinds of different parts ([head, ffn] or [kv_group, ffn]; block prunes whole attention and FFN blocks alone)"
                )
            taken[part] = name
    return tuple(k for k in KINDS if k in names)


def unit_name(unit) -> str:
    """The unit's canonical name: ``"head+ffn"`` for [ffn, head]."""
    return JOINER.join(unit_kinds(unit))


def is_joint(unit) -> bool:
    """Whether a unit joins several kinds."""
    return len(unit_kinds(unit)) > 1


def unit_parts(unit) -> tuple[str, ...]:
    """The parts of a layer a unit prunes: ("attention",), ("ffn",) or ("attention", "ffn")."""
    return tuple(part for kind in unit_kinds(unit) for part in KINDS[kind].parts)


def block_group(group: str) -> str:
    """The block group of an attention or FFN group: ``dec_ffn`` -> ``dec_ffn_block``."""
    return group + BLOCK_SUFFIX


def group_kind(group: str, unit=None) -> str | None:
    """The kind a mask group holds: ffn, block, or for an attention group head (kv_group when ``unit`` says so); None if unknown."""
    if group in FFN_GROUPS:
        return "ffn"
    if group.endswith(BLOCK_SUFFIX) and group[: -len(BLOCK_SUFFIX)] in (*GROUPS, *FFN_GROUPS):
        return "block"
    if group in GROUPS:
        return "kv_group" if unit is not None and "kv_group" in unit_kinds(unit) else "head"
    return None


def mask_kinds(groups, unit=None) -> tuple[str, ...]:
    """The kinds a mask's groups hold (registry order); a group of no kind is a ValueError naming it."""
    kinds = set()
    for group in groups:
        kind = group_kind(str(group), unit)
        if kind is None:
            raise ValueError(
                f"mask group {group!r} is of no unit kind: attention groups are {list(GROUPS)}, FFN groups {list(FFN_GROUPS)}, "
                f"block groups <group>{BLOCK_SUFFIX}"
            )
        kinds.add(kind)
    return tuple(k for k in KINDS if k in kinds)


def ablation_refusal(unit) -> str | None:
    """Why single-unit ablation is no useful order for ``unit`` (a kind of it refuses), else None."""
    return next((KINDS[k].ablation for k in unit_kinds(unit) if KINDS[k].ablation), None)


def noun(unit, plural: bool = False) -> str:
    """What one unit is called (``head``, ``neuron``; ``unit`` for a joint unit), optionally plural."""
    kinds = unit_kinds(unit)
    word = KINDS[kinds[0]].noun if len(kinds) == 1 else "unit"
    return word + "s" if plural else word
