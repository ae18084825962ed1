"""Pruning-unit kinds: the base class, the registry and the built-in kinds (see unit_kind.py)."""

from headprune.core.attention.kind import HeadKind, KVGroupKind
from headprune.core.block.kind import BlockKind
from headprune.core.ffn.kind import FFNKind
from headprune.core.hidden.kind import HiddenKind
from headprune.core.kinds.kind_registry import KINDS, kind_named, kinds_of, register_kind, unregister_kind
from headprune.core.kinds.unit_kind import UnitKind
from headprune.core.layer.kind import LayerKind
from headprune.core.vocab.kind import VocabKind

for _kind in (HeadKind(), KVGroupKind(), FFNKind(), BlockKind(), LayerKind(), HiddenKind(), VocabKind()):
    if _kind.name not in KINDS:
        register_kind(_kind)

__all__ = ["KINDS", "UnitKind", "kind_named", "kinds_of", "register_kind", "unregister_kind"]
