"""The bytes cost: the weight bytes one decoded token reads, predicted per kind and joint, equal to the pruned model's own count."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import tiny_bert
from experiment_helpers import make_cfg, results
from tiny_llms import tiny_llama

from headprune.core.counting import model_bytes
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.selection.mask_search import search_mask
from headprune.selection.unit_costs import unit_bytes_cost_model

LLAMA_UNITS = ["head", "kv_group", "ffn", "hidden", "layer", "block", "vocab", "kv_group+ffn+vocab", "head+ffn+hidden+vocab"]
BERT_UNITS = ["head", "ffn", "hidden", "layer", "block", "vocab", "head+ffn+vocab"]


def _random_mask(groups, seed=0, keep=0.6):
    """Each unit kept with probability ``keep``; every row keeps its first unit (a model that still runs)."""
    gen = torch.Generator().manual_seed(seed)
    mask = {g: (torch.rand(layers, units, generator=gen) < keep).float() for g, (layers, units) in groups.items()}
    for value in mask.values():
        value[..., 0] = 1
    return mask


def _llama(tie: bool = False):
    model = tiny_llama()
    if tie:
        model.lm_head.weight = model.get_input_embeddings().weight
    return model


@pytest.mark.parametrize(
    "make,unit", [(tiny_llama, u) for u in LLAMA_UNITS] + [(tiny_bert, u) for u in BERT_UNITS], ids=lambda v: getattr(v, "__name__", v)
)
def test_predicted_bytes_equal_the_pruned_models_own_count(make, unit):
    model = make()
    costs = unit_bytes_cost_model(model, unit)
    assert costs.unit == "bytes" and costs.total == model_bytes(model)
    mask = _random_mask(unit_gates(model, unit).groups)
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, unit), mask)
    assert 0 < model_bytes(pruned) <= model_bytes(model)
    assert costs.cost(mask) == pytest.approx(model_bytes(pruned), rel=0.01)


@pytest.mark.parametrize("tie", [False, True])
def test_a_decoded_token_reads_every_weight_and_one_row_of_an_untied_embedding(tie):
    model = _llama(tie)
    size = 4  # float32
    table = model.get_input_embeddings().weight
    weights = sum(p.numel() for p in model.parameters())  # parameters() lists a tied matrix once
    expected = weights if tie else weights - table.numel() + table.shape[1]
    assert model_bytes(model) == expected * size


@pytest.mark.parametrize("tie", [False, True])
def test_a_token_of_the_output_head_costs_its_row_whether_tied_or_not(tie):
    model = _llama(tie)
    vocab = model.config.vocab_size
    costs = unit_bytes_cost_model(model, "vocab")
    row = model.config.hidden_size * 4
    assert costs.tables["vocab"][0, vocab] - costs.tables["vocab"][0, vocab - 1] == row
    mask = {"vocab": torch.ones(1, vocab)}
    mask["vocab"][0, 5:25] = 0
    assert costs.total - costs.cost(mask) == 20 * row


def test_an_encoders_embedding_rows_are_free():
    """A classifier reads one row of its word embedding per token: removing tokens saves no bytes, and the search skips them."""
    model = tiny_bert()
    costs = unit_bytes_cost_model(model, "vocab")
    vocab = model.config.vocab_size
    assert float(costs.tables["vocab"].abs().max()) == 0.0
    assert costs.cost({"vocab": torch.cat([torch.ones(1, 8), torch.zeros(1, vocab - 8)], 1)}) == costs.total


def test_a_joint_bytes_target_ranks_tokens_beside_kv_groups_and_neurons():
    model = tiny_llama()
    unit = "kv_group+ffn+vocab"
    costs = unit_bytes_cost_model(model, unit)
    groups = unit_gates(model, unit).groups
    scores = {g: torch.rand(shape, generator=torch.Generator().manual_seed(1)) for g, shape in groups.items()}
    found = search_mask(scores, costs, {"bytes": 0.75})
    assert found.kept_fraction <= 0.75 + 1e-12
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, unit), found.mask)
    assert model_bytes(pruned) / model_bytes(model) == pytest.approx(found.kept_fraction, rel=0.01)
    kinds = {g for g, _, _ in found.removed}
    assert {"vocab", "dec_ffn"} <= kinds  # tokens and neurons compete in one budget


def test_prune_to_a_bytes_target_records_bytes_kept_beside_flops_kept(tmp_path):
    from hydra.utils import get_method

    from headprune.validation import validate

    torch.set_num_threads(1)
    overrides = ("prune.unit=[kv_group,ffn,vocab]", "prune.cost=bytes", "prune.target={bytes:0.75}")
    cfg = make_cfg(tmp_path, "prune", "lm", "data.tokenizer.vocab_size=300", *overrides)  # BPE beyond the 256 bytes
    validate(cfg)
    get_method(cfg.run)(cfg)
    points = results(tmp_path)["results"]["points"]
    unpruned, point = points[0], points[1]
    assert unpruned["bytes_kept"] == 1.0 and point["cost_unit"] == "bytes"
    assert point["bytes_kept"] <= 0.75 + 1e-9 and 0 < point["flops_kept"] < 1
    assert set(point["units_by_kind"]) == {"kv_group", "ffn", "vocab"}


def test_a_bytes_target_needs_the_bytes_cost_model():
    from headprune.selection.unit_costs import unit_flops_cost_model

    model = tiny_llama()
    scores = {g: torch.rand(shape) for g, shape in unit_gates(model, "ffn").groups.items()}
    with pytest.raises(ValueError, match="a bytes target needs a bytes cost model"):
        search_mask(scores, unit_flops_cost_model(model, "ffn", seq_len=8), {"bytes": 0.75})
