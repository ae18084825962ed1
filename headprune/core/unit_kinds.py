"""The kinds of pruning unit, by name: the registry's functions (headprune.core.kinds) under their familiar names."""

import headprune.core.kinds  # noqa: F401  (registers the built-in kinds)
from headprune.core.block.gates import block_group  # noqa: F401
from headprune.core.kinds.kind_registry import (  # noqa: F401 (re-exported)
    KINDS,
    ablation_refusal,
    group_kind,
    is_joint,
    keep_one_refusal,
    kind_of_group,
    kinds_of,
    latency_timings,
    lsq_refits_heads_alone,
    lsq_refusal,
    mask_kinds,
    noun,
    reconstruction_refusal,
    shrunk_fields,
    unit_kinds,
    unit_name,
)
