"""The kinds of pruning unit, by name: the registry's functions (headprune.core.kinds) under their familiar names.

A unit is one kind (``"ffn"``) or a joint list of kinds covering different parts (``"head+ffn"``,
``["kv_group", "ffn"]``): its masks hold the groups of each kind side by side, and a group's kind is the kind of the
unit that owns it (attention groups ``enc_self``, ``enc_dec``, ``dec_self``: heads, or KV groups when the unit says
``kv_group``; FFN groups ``enc_ffn``, ``dec_ffn``; block groups ``<group>_block``).
"""

from __future__ import annotations

import headprune.core.kinds  # noqa: F401  (registers the built-in kinds)
from headprune.core.blocks import BLOCK_SUFFIX, block_group
from headprune.core.kinds.ffn import NEURON_ABLATION
from headprune.core.kinds.kind_registry import (
    JOINER,
    KINDS,
    ablation_refusal,
    group_kind,
    is_joint,
    kinds_of,
    mask_kinds,
    noun,
    recovery_parts,
    shrunk_fields,
    unit_kinds,
    unit_name,
    unit_parts,
)

__all__ = [
    "BLOCK_SUFFIX",
    "JOINER",
    "KINDS",
    "NEURON_ABLATION",
    "ablation_refusal",
    "block_group",
    "group_kind",
    "is_joint",
    "kinds_of",
    "mask_kinds",
    "noun",
    "recovery_parts",
    "shrunk_fields",
    "unit_kinds",
    "unit_name",
    "unit_parts",
]
