"""Query heads are one kind among the others: every kind's gates provide the Gates protocol, and code outside core/ reads it.

The query heads a mask gates come from its ``base_masks`` (``query_heads_of``), compared here with the gates acting on the
model; no code outside core/ names the query-head gates class or asks a gates object for a query-head mask of its own.
"""

import re
from pathlib import Path

import pytest
import torch
from conftest import tiny_marian
from kind_lowrank_plugin import LowRankGates, LowRankKind, attach_lowrank
from kind_plugin import FFNHalfKind
from tiny_llms import lm_batch, tiny_llama

from headprune.core.inputs import model_inputs
from headprune.core.kinds import KINDS, UnitKind, register_kind, unregister_kind
from headprune.core.kinds.gates_protocol import METHODS, missing_members
from headprune.core.units import model_gates, query_heads_of, unit_gates

PACKAGE = Path(__file__).resolve().parents[1] / "headprune"
QUERY_HEAD_NAMES = re.compile(r"HeadGates|head_mask")
PUBLIC_API = PACKAGE / "__init__.py"  # re-exports the gates classes, HeadGates among them, for users


def _random_mask(groups: dict, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {g: (torch.rand(layers, units, generator=gen) < 0.6).float() for g, (layers, units) in groups.items()}


def _logits(model, batch):
    with torch.no_grad():
        return model(**model_inputs(model, batch)).logits


def test_no_code_outside_core_names_the_query_head_gates():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{n}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if PACKAGE / "core" not in path.parents and path != PUBLIC_API
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if QUERY_HEAD_NAMES.search(line)
    ]
    assert found == [], "outside core/, ask the kind's gates (headprune.core.units.model_gates, query_heads_of):\n" + "\n".join(found)


@pytest.mark.parametrize("model_fn", [lambda: tiny_llama(layers=3, heads=8, kv_heads=4), tiny_marian], ids=["llama", "marian"])
def test_every_kinds_gates_provide_the_protocol(model_fn):
    model = model_fn()
    for kind in KINDS.values():
        if kind.available(model) or (kind.name == "kv_group" and kind.refusal(model.config.to_dict(), {})):
            continue
        gates = unit_gates(model, kind.name)
        assert isinstance(gates, kind.gates_class) and missing_members(gates) == [], kind.name
    assert missing_members(unit_gates(model, "head+ffn")) == []


def test_register_kind_names_the_missing_gates_methods_in_one_line():
    class Partial:
        unit = "partial"

        def ones(self):
            return {}

    class PartialKind(FFNHalfKind):
        name = "partial"
        gates_class = Partial

    with pytest.raises(TypeError, match=r"Partial, the gates of PartialKind \('partial'\), lacks present, normalize_mask") as err:
        register_kind(PartialKind())
    assert "\n" not in str(err.value) and "partial" not in KINDS
    assert set(METHODS) - {"ones"} == set(str(err.value).split("lacks ")[1].split(":")[0].split(", "))


def test_the_plugin_kinds_register_without_a_query_head_mask():
    for kind in (FFNHalfKind(), LowRankKind()):
        assert isinstance(kind, UnitKind) and missing_members(kind.gates_class) == []
        register_kind(kind)
        unregister_kind(kind.name)
    model = attach_lowrank(tiny_llama(), rank=4)
    gates = LowRankGates(model)
    assert query_heads_of(gates, _random_mask(gates.groups, 0)) == {}  # it gates no query head


@pytest.mark.parametrize("unit", ["kv_group", "block", "kv_group+ffn", "head+ffn", "ffn"])
def test_query_heads_of_a_mask_gate_the_model_as_the_mask_does_on_attention(unit):
    model = tiny_llama(layers=3, heads=8, kv_heads=4)
    batch = lm_batch()
    gates, heads = unit_gates(model, unit), model_gates(model)
    mask = _random_mask(gates.groups, 1)
    attention_only = {g: m if KINDS["head"].owns(g.removesuffix("_block")) else torch.ones_like(m) for g, m in mask.items()}
    with gates.masked(attention_only):
        masked = _logits(model, batch)
    query = query_heads_of(gates, attention_only, hard=True)
    with heads.masked(query):
        by_heads = _logits(model, batch)
    torch.testing.assert_close(by_heads, masked, atol=1e-6 * float(masked.abs().max()), rtol=0)
    assert (query == {}) == (unit == "ffn")
