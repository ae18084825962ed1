"""Selection in every unit: FLOPs and latency tables per kind, one search over heads and neurons, the uniform layout of a
joint unit, least-squares neuron scales, neuron rearrangement.

Each check compares two ways of computing the same thing on a tiny random model (fp32), or a search with its definition.
"""

import copy
import json

import pytest
import torch
from conftest import classifier_batch, is_uniform, tiny_bert
from tiny_llms import lm_batch, tiny_family, tiny_llama

from headprune.core.counting import model_cost
from headprune.core.ffn.gates import FFNGates
from headprune.core.ffn.pruning import prune_ffn_mask
from headprune.core.inputs import model_inputs
from headprune.core.kinds import KINDS
from headprune.core.pruning import prune_heads, prune_kv_groups, pruning_record
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.results.mask_files import mask_file_of
from headprune.results.points import kind_counts, kinds_label
from headprune.selection.greedy import random_scores
from headprune.selection.latency import cached_unit_latency_model, interpolated, width_grid
from headprune.selection.lsq import captured_down_inputs, ffn_lsq_recover, valid_rows
from headprune.selection.mask_search import nonnegative, removal_order, search_mask
from headprune.selection.uniform import UniformPath, layout_search, uniform_mask
from headprune.selection.unit_costs import unit_flops_cost_model
from headprune.selection.unit_rearrange import example_gradients, gradient_form, rearrange_ffn_mask

SEQ = 16


def _logits(model, batch):
    with torch.no_grad():
        return model(**model_inputs(model, batch)).logits


def _random_mask(groups, seed=0, keep=0.6):
    gen = torch.Generator().manual_seed(seed)
    return {g: (torch.rand(layers, units, generator=gen) < keep).float() for g, (layers, units) in groups.items()}


@pytest.mark.parametrize("make", [tiny_bert, lambda: tiny_family("gpt2")])
@pytest.mark.parametrize("unit", ["ffn", "head+ffn", "block"])
def test_flops_prediction_of_every_unit_equals_model_cost_of_the_pruned_model(make, unit):
    model = make()
    gates = unit_gates(model, unit)
    costs = unit_flops_cost_model(model, unit, seq_len=SEQ)
    assert set(costs.tables) == set(gates.groups)
    assert costs.total == pytest.approx(model_cost(model, SEQ).flops, rel=1e-12)
    mask = _random_mask(gates.groups, keep=0.5)
    for value in mask.values():
        value[0] = 0  # an emptied layer: its phantom head or neuron still counts
    prune_unit_mask(gates, mask)
    assert costs.cost(mask) == pytest.approx(model_cost(model, SEQ).flops, rel=1e-12)


def test_joint_kv_group_tables_are_the_kv_group_model_s_and_the_neurons_are_counted_on_top():
    model = tiny_llama()
    joint = unit_flops_cost_model(model, "kv_group+ffn", seq_len=SEQ)
    kv = unit_flops_cost_model(model, "kv_group", seq_len=SEQ)
    ffn = unit_flops_cost_model(model, "ffn", seq_len=SEQ)
    assert torch.equal(joint.tables["dec_self"], kv.tables["dec_self"]) and torch.equal(joint.tables["dec_ffn"], ffn.tables["dec_ffn"])
    assert joint.total == pytest.approx(kv.total, rel=1e-12)
    mask = {"dec_self": torch.ones(3, 2), "dec_ffn": torch.ones(3, 64)}
    mask["dec_ffn"][1, :10] = 0
    assert kv.total - joint.cost(mask) == pytest.approx(ffn.total - ffn.cost({"dec_ffn": mask["dec_ffn"]}), rel=1e-12)


def test_kv_group_latency_tables_read_every_group_s_query_heads_of_the_head_table():
    """Pruning query heads k*n..H-1 of a layer removes exactly the KV groups k..KV-1: the same model, the same time."""
    by_heads, by_groups = tiny_llama(layers=2, heads=8, kv_heads=4), tiny_llama(layers=2, heads=8, kv_heads=4)
    prune_heads(by_heads, {"dec_self": {0: list(range(4, 8)), 1: list(range(4, 8))}})
    prune_kv_groups(by_groups, {"dec_self": {0: [2, 3], 1: [2, 3]}})
    assert pruning_record(by_heads) == pruning_record(by_groups)
    table = {"dec_self": torch.arange(18, dtype=torch.float64).view(2, 9)}
    kv_tables = KINDS["kv_group"].latency_tables(table, None, by_groups)  # 2 query heads per KV head
    assert kv_tables["dec_self"].tolist() == [[0, 2, 4, 6, 8], [9, 11, 13, 15, 17]]


def _old_removal_order(scores, costs, min_per_layer=0):
    """The plain definition: at every step scan every layer for its lowest kept unit and take the least score / saving."""
    shape = costs.groups
    groups = list(shape)
    scores = nonnegative(scores)
    mask = {g: torch.ones(l, h) for g, (l, h) in shape.items()}
    order = []
    while True:
        best = None
        for gi, group in enumerate(groups):
            for layer in range(shape[group][0]):
                kept = int(mask[group][layer].sum())
                if kept - 1 < min_per_layer:
                    continue
                saving = costs.saving(group, layer, kept)
                if saving <= 0:
                    continue
                alive = mask[group][layer].nonzero().flatten().tolist()
                head = min(alive, key=lambda h: (float(scores[group][layer, h]), h))
                key = (float(scores[group][layer, head]) / saving, gi, layer, head)
                if best is None or key < best[0]:
                    best = (key, (group, layer, head))
        if best is None:
            return order
        mask[best[1][0]][best[1][1], best[1][2]] = 0.0
        order.append(best[1])


def test_heap_removal_order_equals_the_plain_definition_over_heads_and_neurons():
    model = tiny_bert()
    costs = unit_flops_cost_model(model, "head+ffn", seq_len=SEQ)
    scores = random_scores(costs.groups, seed=3)
    scores["enc_ffn"][1, :5] = scores["enc_ffn"][1, 5]  # ties broken by id
    for floor in (0, 1):
        assert removal_order(scores, costs, min_per_layer=floor) == _old_removal_order(scores, costs, floor)


def test_one_flops_target_removes_heads_and_neurons_together():
    model = tiny_bert()
    costs = unit_flops_cost_model(model, "head+ffn", seq_len=SEQ)
    result = search_mask(random_scores(costs.groups, seed=1), costs, {"flops": 0.7})
    assert result.kept_fraction <= 0.7 + 1e-12 and len({g for g, _, _ in result.removed}) == 2  # both kinds lost units
    twin = tiny_bert()
    prune_unit_mask(unit_gates(twin, "head+ffn"), result.mask)
    assert model_cost(twin, SEQ).flops / model_cost(model, SEQ).flops == pytest.approx(result.kept_fraction, rel=1e-12)


def test_uniform_search_of_a_joint_unit_keeps_one_width_per_group_and_its_costs_without_masks_are_exact():
    model = tiny_llama()
    gates = unit_gates(model, "head+ffn")
    costs = unit_flops_cost_model(model, "head+ffn", seq_len=SEQ)
    scores = random_scores(gates.groups, seed=2)
    path = UniformPath(scores, costs, gates.ones(), list(costs.groups), floor=1)
    levels = path.levels()
    assert len(levels) > 5 and len({c["dec_self"] for c in levels}) > 1 and len({c["dec_ffn"] for c in levels}) > 1
    for counts in levels[:: max(1, len(levels) // 12)]:
        assert path.cost(counts) == pytest.approx(costs.table_cost(uniform_mask(scores, costs.groups, counts)), rel=1e-12)
    result = layout_search("uniform")(scores, costs, {"speedup": 1.4})
    assert is_uniform(result.mask) and result.speedup >= 1.4 - 1e-9
    assert {g: int((m[0] == 0).sum()) > 0 for g, m in result.mask.items()} == {"dec_self": True, "dec_ffn": True}


def _ffn_mask(groups):
    mask = _random_mask(groups, seed=4, keep=0.5)
    for value in mask.values():
        value[-1] = 1  # the last block whole
    return mask


def test_ffn_lsq_masked_and_pruned_twins_give_the_same_scales_and_outputs():
    model = tiny_bert()
    batches = [classifier_batch(seed=s, batch=8, length=12) for s in range(3)]
    teacher = copy.deepcopy(model)
    mask = _ffn_mask(FFNGates(model).groups)
    pruned = copy.deepcopy(model)
    prune_ffn_mask(pruned, mask)
    masked_scales = ffn_lsq_recover(model, FFNGates(model), batches, mask=mask)
    pruned_scales = ffn_lsq_recover(pruned, FFNGates(pruned), batches, teacher=teacher)
    torch.testing.assert_close(masked_scales["enc_ffn"], pruned_scales["enc_ffn"], atol=1e-4, rtol=1e-4)
    assert float((masked_scales["enc_ffn"] - 1).abs().max()) > 1e-3  # the scales moved
    assert torch.equal(masked_scales["enc_ffn"][mask["enc_ffn"] == 0], torch.ones(int((mask["enc_ffn"] == 0).sum())))
    with FFNGates(model).masked(mask):
        masked = _logits(model, batches[0])
    torch.testing.assert_close(_logits(pruned, batches[0]), masked, atol=1e-5 * float(masked.abs().max()), rtol=0)


def _block_errors(model, teacher, mask, batch):
    """Relative squared error of every FFN block's output (without bias) against the teacher's, under ``mask``."""
    gates, teacher_gates = FFNGates(model), FFNGates(teacher)
    with gates.masked(mask):
        student = captured_down_inputs(model, gates.sites, batch)
    reference = captured_down_inputs(teacher, teacher_gates.sites, batch)
    errors = []
    for site, teacher_site in zip(gates.sites, teacher_gates.sites):
        out = valid_rows(site, batch, student[id(site)]) @ site.down().weight.t()
        ref = valid_rows(teacher_site, batch, reference[id(teacher_site)]) @ teacher_site.down().weight.t()
        errors.append(float((out - ref).pow(2).sum() / ref.pow(2).sum()))
    return torch.tensor(errors)


def test_ffn_lsq_lowers_every_block_s_output_error_and_equals_the_explicit_least_squares():
    model, batches = tiny_llama(), [lm_batch(seed=s, batch=4, length=12) for s in range(3)]
    teacher = copy.deepcopy(model)
    mask = _ffn_mask(FFNGates(model).groups)
    before = _block_errors(model, teacher, mask, batches[0])
    gates = FFNGates(model)
    site = gates.sites[0]
    with gates.masked(mask):  # the first block by explicit contributions c_i = x_i w_i^T: (N, K, hidden)
        kept = mask["dec_ffn"][0].nonzero().flatten().tolist()
        xs = [valid_rows(site, b, captured_down_inputs(model, [site], b)[id(site)])[:, kept].double() for b in batches]
    ys = [
        valid_rows(site, b, captured_down_inputs(teacher, [FFNGates(teacher).sites[0]], b)[id(FFNGates(teacher).sites[0])]) for b in batches
    ]
    w = site.down().weight[:, kept].double()
    c = torch.cat([torch.einsum("nk,ok->nko", x, w) for x in xs])
    y = torch.cat([yy.double() @ teacher.model.layers[0].mlp.down_proj.weight.double().t() for yy in ys])
    gram, rhs = torch.einsum("nko,njo->kj", c, c), torch.einsum("nko,no->k", c, y)
    lam = 1e-3 * float(gram.diagonal().mean())
    explicit = torch.linalg.solve(gram + lam * torch.eye(len(kept), dtype=gram.dtype), rhs + lam)
    scales = ffn_lsq_recover(model, gates, batches, mask=mask)
    torch.testing.assert_close(scales["dec_ffn"][0, kept].double(), explicit, atol=1e-4, rtol=1e-4)
    after = _block_errors(model, teacher, mask, batches[0])
    assert bool((after[:-1] < before[:-1]).all())  # every pruned block fits its teacher better


def test_ffn_rearrangement_keeps_each_count_and_never_raises_the_gradient_form():
    model, batch = tiny_llama(), lm_batch()
    gates = FFNGates(model)
    grads = example_gradients(model, gates, [batch, lm_batch(seed=1)], unit="ffn")
    assert grads["dec_ffn"].shape == (6, 3, 64)
    mask = _ffn_mask(gates.groups)
    result = rearrange_ffn_mask(mask, grads)
    assert torch.equal(result.mask["dec_ffn"].sum(-1), mask["dec_ffn"].sum(-1))
    assert bool((result.after["dec_ffn"] <= result.before["dec_ffn"] + 1e-12).all()) and result.layers_changed >= 1
    fisher = torch.einsum("nw,nv->wv", grads["dec_ffn"][:, 0], grads["dec_ffn"][:, 0]) / grads["dec_ffn"].shape[0]
    removed = (mask["dec_ffn"][0] == 0).double()
    assert gradient_form(removed, grads["dec_ffn"][:, 0]) == pytest.approx(float(removed @ fisher @ removed), rel=1e-9)


def test_ffn_latency_tables_are_monotone_cached_and_add_to_the_head_tables(tmp_path):
    assert width_grid(64, 4) == [0, 16, 32, 48, 64] and width_grid(3, 8) == [0, 1, 2, 3]
    torch.testing.assert_close(interpolated([0, 2, 4], [0.0, 2.0, 6.0], 4), torch.tensor([0, 1, 2, 4, 6], dtype=torch.float64))
    model = tiny_llama(layers=2)
    inputs = {k: v for k, v in lm_batch().items() if k in ("input_ids", "attention_mask")}
    costs = cached_unit_latency_model(model, inputs, tmp_path, unit="head+ffn", repeats=1, warmup=0, points=2)
    assert costs.unit == "seconds" and set(costs.tables) == {"dec_self", "dec_ffn"} and costs.fixed >= 0
    assert costs.tables["dec_ffn"].shape == (2, 65) and bool((costs.tables["dec_ffn"].diff(dim=1) >= 0).all())
    again = cached_unit_latency_model(model, inputs, tmp_path, unit="head+ffn", repeats=1, warmup=0, points=2)  # read back
    assert again.as_dict() == json.loads(json.dumps(costs.as_dict())) and len(list(tmp_path.iterdir())) == 1


def test_mask_files_say_their_unit_and_kinds_and_label_what_each_kind_lost(tmp_path):
    mask = {"dec_self": [[1, 0], [1, 1]], "dec_ffn": [[1, 0, 0, 1], [0, 1, 1, 1]]}
    steps = [{"fraction": 0.3, "mask": mask}]
    found = mask_file_of({"results": {"unit": ["ffn", "kv_group"], "orders": {"fisher": {"steps": steps}}}}, tmp_path / "r.json")
    assert found.unit == "kv_group+ffn" and found.kinds == ("kv_group", "ffn")
    assert kind_counts(found.candidates[0].mask, found.unit) == {"kv_group": (1, 4), "ffn": (3, 8)}
    unnamed = mask_file_of({"mask": {"enc_self_block": [[0], [1]], "enc_ffn_block": [[1], [1]]}}, tmp_path / "m.json")
    assert unnamed.unit is None and unnamed.kinds == ("block",)
    old = mask_file_of(
        {"results": {"unit": "head", "orders": {"fisher": {"steps": [{"fraction": 0.5, "mask": {"enc_self": [[1, 0]]}}]}}}}, tmp_path
    )
    assert old.unit == "head" and old.kinds == ("head",)
    assert kind_counts(mask, "head+ffn") == {"head": (1, 4), "ffn": (3, 8)}
    assert kinds_label(mask, "kv_group+ffn") == "KV groups 25%, neurons 38%"


def test_iterative_pruning_of_heads_and_neurons_with_head_and_neuron_recovery():
    from headprune.selection.lsq import unit_lsq_recoverer
    from headprune.selection.schedule import iterative_prune

    model = tiny_bert()
    plain = copy.deepcopy(model)
    batches = [classifier_batch(seed=s, batch=8, length=12) for s in range(2)]
    costs = unit_flops_cost_model(model, "head+ffn", seq_len=SEQ)
    schedule = [{"flops": 0.8}, {"flops": 0.6}]
    steps = iterative_prune(model, schedule, batches, recover=unit_lsq_recoverer("head+ffn"), costs=costs, unit="head+ffn")
    iterative_prune(plain, schedule, batches, costs=costs, unit="head+ffn", keep_models=False)
    assert float((_logits(model, batches[0]) - _logits(plain, batches[0])).abs().max()) > 1e-4  # the recovery moved the weights
    assert [set(s.mask) for s in steps] == [{"enc_self", "enc_ffn"}] * 2
    for before, after in zip(steps, steps[1:]):
        assert all(bool((after.mask[g] <= before.mask[g]).all()) for g in after.mask)  # removed units stay removed
    gates = unit_gates(model, "head+ffn")
    assert all(torch.equal(gates.present()[g], m.bool()) for g, m in steps[-1].mask.items())
    assert model_cost(model, SEQ).flops <= 0.6 * costs.total * (1 + 1e-9) and 0 < steps[0].fraction < steps[1].fraction


def test_the_pareto_table_of_a_joint_unit_says_what_each_kind_lost():
    from headprune.viz.tables import kv_cache_kept, pareto_table

    mask = {"dec_self": [[1, 0], [1, 1]], "dec_ffn": [[1, 0, 0, 1], [0, 1, 1, 1]]}
    point = {"order": "fisher", "recovery": "none", "step": "flops=0.8", "units_removed": 4, "units_total": 12, "score": 30.0}
    point.update(predicted_speedup=1.2, flops_kept=0.8, mask=mask)
    unpruned = {**point, "step": "0%", "units_removed": 0, "predicted_speedup": 1.0, "flops_kept": 1.0, "score": 29.0}
    unpruned.pop("mask")
    study = {"pareto": {"unit": "kv_group+ffn", "metric": "perplexity", "higher_is_better": False, "points": [unpruned, point]}}
    study["pareto"].update(cost="flops", split="eval", n_examples=10, selection_split="heldout")
    table = pareto_table(study)
    assert "| units removed |" in table and "4/12 (KV groups 25%, neurons 38%)" in table
    assert kv_cache_kept(point, "kv_group+ffn") == 0.75  # the FFN groups are no part of the KV cache


def test_ffn_lsq_after_residual_channels_go_fits_the_teachers_output_at_the_kept_channels():
    """Neurons and residual channels removed: the first block's scales are the dense least squares on the kept channels."""
    from headprune.core.hidden.sites import channel_book
    from headprune.core.projections import linear_weight

    model = tiny_llama()
    teacher, batches = copy.deepcopy(model), [lm_batch(seed=s) for s in range(2)]
    gates = unit_gates(model, ["ffn", "hidden"])
    mask = {group: torch.ones(shape) for group, shape in gates.groups.items()}
    mask["dec_ffn"][:, ::2] = 0
    mask["hidden"][0, 4:12] = 0  # 24 of 32 channels: a multiple of the 4 heads, as Llama's config needs
    prune_unit_mask(gates, mask)
    channels = channel_book(model)["ids"]
    site, reference = FFNGates(model).site("dec_ffn", 0), FFNGates(teacher).site("dec_ffn", 0)
    x = torch.cat([valid_rows(site, b, captured_down_inputs(model, [site], b, stop=True)[id(site)]) for b in batches])  # (N, K)
    teacher_x = [valid_rows(reference, b, captured_down_inputs(teacher, [reference], b, stop=True)[id(reference)]) for b in batches]
    y = (torch.cat(teacher_x) @ linear_weight(reference.down()).t())[:, channels]  # (N, 24): the teacher block at the kept channels
    columns = linear_weight(site.down())  # (24, K)
    design = (x[:, None, :] * columns[None]).reshape(-1, x.shape[1])  # (N * 24, K): neuron k's contribution to each output
    dense = torch.linalg.lstsq(design.double(), y.reshape(-1, 1).double()).solution[:, 0]
    scales = ffn_lsq_recover(model, FFNGates(model), batches, teacher=teacher, ridge=1e-9, max_scale=1e6)
    torch.testing.assert_close(scales["dec_ffn"][0, site.neuron_ids], dense.float(), rtol=1e-3, atol=1e-3 * float(dense.abs().max()))
