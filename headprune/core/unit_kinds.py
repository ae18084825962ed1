"""The kinds of pruning unit, by name: the registry's functions (headprune.core.kinds) under their familiar names."""

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
