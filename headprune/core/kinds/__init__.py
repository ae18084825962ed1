"""Pruning-unit kinds: the base class, the registry and the built-in kinds (see unit_kind.py)."""

from headprune.core.kinds.attention import HeadKind, KVGroupKind
from headprune.core.kinds.block import BlockKind
from headprune.core.kinds.ffn import FFNKind
from headprune.core.kinds.hidden import HiddenKind
from headprune.core.kinds.kind_registry import KINDS, kind_named, kinds_of, register_kind, unregister_kind
from headprune.core.kinds.layer import LayerKind
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.kinds.vocab import VocabKind

for _kind in (HeadKind(), KVGroupKind(), FFNKind(), BlockKind(), LayerKind(), HiddenKind(), VocabKind()):
    if _kind.name not in KINDS:
        register_kind(_kind)

__all__ = ["KINDS", "UnitKind", "kind_named", "kinds_of", "register_kind", "unregister_kind"]
