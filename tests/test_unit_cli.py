"""Pruning units beyond heads from the experiments: joint prune runs labelled by kind, their GGUF export, speed and the study."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from experiment_helpers import make_cfg, results

LM = ["data.tokenizer.vocab_size=300"]  # the GGUF tokenizer needs BPE merges (a vocabulary beyond single bytes)
SMALL_SPEED = ["speed.batch_sizes=[4]", "speed.repeats=2", "speed.warmup=0", "speed.examples=8"]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """The LM and NLI test tasks, loaded once."""
    from headprune.tasks import registry

    torch.set_num_threads(1)
    return {
        name: registry.load_task(make_cfg(tmp_path_factory.mktemp(name), "ablate", name, *extra))
        for name, extra in (("lm", LM), ("nli", []))
    }


@pytest.fixture
def shared(tasks, monkeypatch):
    """Every experiment reuses the loaded task of its model's kind, seen in the config's prune.unit."""
    from headprune.tasks import registry
    from headprune.tasks.unit_task import in_unit, unit_of

    by_kind = {"causal_lm": "lm", "classifier": "nli"}
    monkeypatch.setattr(registry, "load_task", lambda cfg: in_unit(tasks[by_kind[cfg.model.kind]], unit_of(cfg)))
    return tasks


def run(tmp_path, experiment: str, task: str, *overrides) -> dict:
    from hydra.utils import get_method

    from headprune.validation import validate

    cfg = make_cfg(tmp_path, experiment, task, *(LM if task == "lm" else []), *overrides)
    validate(cfg)
    get_method(cfg.run)(cfg)
    return results(tmp_path)


def removed_share(mask: dict, groups: tuple[str, ...]) -> float:
    """The share of zeros over ``groups`` of a JSON mask."""
    values = [v for g in groups for row in mask[g] for v in row]
    return values.count(0) / len(values)


def test_kv_group_and_neurons_pruned_together_then_exported_to_deci_gguf(shared, tmp_path):
    """prune.unit=[kv_group,ffn] ranks KV groups and neurons under one fraction; its mask exports to a deci GGUF whose
    per-layer feed_forward_length is each layer's kept neurons, read back with the gguf package."""
    from headprune.core.ffn.sites import find_ffn_sites
    from headprune.core.units import prune_unit_mask, unit_gates
    from headprune.export.gguf_numpy import read_layout
    from headprune.results.run_dir import mask_from_json

    pruned = run(tmp_path / "prune", "prune", "lm", "prune.unit=[kv_group,ffn]", "prune.fractions=[0.3]")["results"]
    assert pruned["unit"] == "kv_group+ffn"
    step = pruned["orders"]["importance"]["steps"][0]
    kv, ffn = removed_share(step["mask"], ("dec_self",)), removed_share(step["mask"], ("dec_ffn",))
    assert step["kinds_removed"] == f"KV groups {100 * kv:.0f}%, neurons {100 * ffn:.0f}%"
    assert step["units_removed"] == int(0.3 * pruned["units_total"])  # a fraction rounds down to whole units
    by_kind = step["units_by_kind"]  # the same counts per kind: they add up to the step's and the run's
    assert set(by_kind) == {"kv_group", "ffn"} and by_kind["kv_group"]["removed"] == round(kv * by_kind["kv_group"]["total"])
    assert sum(k["removed"] for k in by_kind.values()) == step["units_removed"]
    assert sum(k["total"] for k in by_kind.values()) == pruned["units_total"]

    mask_file = tmp_path / "prune" / "results.json"
    run(
        tmp_path / "export",
        "export",
        "lm",
        "export.format=gguf",
        "export.tokenizer_pre=gpt-2",
        f"export.mask_file={mask_file}",
        "export.fraction=0.3",
    )
    model = copy.deepcopy(shared["lm"].model)  # the widths of the model the mask prunes, one per layer
    gates = unit_gates(model, "kv_group+ffn")
    prune_unit_mask(gates, gates.normalize_mask(mask_from_json(step["mask"])))
    kept = [len(site.neuron_ids) for site in sorted(find_ffn_sites(model), key=lambda site: site.layer)]
    assert kept == [sum(row) for row in step["mask"]["dec_ffn"]]
    path = next((tmp_path / "export").rglob("*.gguf"))
    layout = read_layout(str(path))
    assert layout["architecture"] == "deci" and layout["feed_forward_length"] == kept


def test_heads_and_neurons_to_a_flops_target_then_timed(shared, tmp_path):
    """prune.unit=[head,ffn] with a FLOPs target labels its point by what each kind lost, predicts the cost the FLOP model
    gives, and experiment=speed times its mask beside the FLOP-ideal gain."""
    from headprune.core.units import unit_gates
    from headprune.results.run_dir import mask_from_json
    from headprune.selection.unit_costs import unit_flops_cost_model

    pruned = run(tmp_path / "prune", "prune", "nli", "prune.unit=[head,ffn]", "prune.target={flops:0.6}")["results"]
    point = pruned["points"][1]
    heads, neurons = removed_share(point["mask"], ("enc_self",)), removed_share(point["mask"], ("enc_ffn",))
    assert point["kinds_removed"] == f"heads {100 * heads:.0f}%, neurons {100 * neurons:.0f}%"
    assert point["flops_kept"] <= 0.6 + 1e-9
    assert point["units_total"] == sum(len(r) for g in ("enc_self", "enc_ffn") for r in point["mask"][g])

    mask_file = tmp_path / "prune" / "results.json"
    timed = run(tmp_path / "speed", "speed", "nli", f"speed.mask_file={mask_file}", *SMALL_SPEED)["results"]
    assert timed["unit"] == "head+ffn" and timed["score_check"]["agree"]
    assert set(timed["pruning_record"]) == {"enc_self", "enc_ffn"}
    row = timed["rows"][0]  # its FLOP-ideal, counted on both models, is the FLOP cost model's at the timed length
    model = shared["nli"].model
    gates = unit_gates(shared["nli"].gates, "head+ffn")
    costs = unit_flops_cost_model(model, "head+ffn", seq_len=row["seq_len"])
    predicted = 1 / costs.kept_fraction(gates.normalize_mask(mask_from_json(point["mask"]))) - 1
    assert "gain" in row and row["flop_ideal_gain"] == pytest.approx(predicted, rel=1e-3)


def test_recoveries_and_the_control_in_a_joint_unit(shared, tmp_path):
    """lsq (pruned copy, heads then neurons), fine-tune and the control all run on a head + neuron mask."""
    got = run(
        tmp_path,
        "prune",
        "nli",
        "prune.unit=[head,ffn]",
        "prune.fractions=[0.3]",
        "prune.recover=[none,lsq,finetune]",
        "prune.control=true",
        "prune.finetune.max_steps=2",
        "prune.recover_examples=16",
        "prune.save=none",
    )["results"]
    names = {(p["order"], p["recovery"], bool(p.get("control"))) for p in got["points"]}
    assert {("importance", "lsq", False), ("importance", "finetune", False), ("unpruned", "finetune", True)} <= names
    assert all(torch.isfinite(torch.tensor(p["score"])) for p in got["points"])


def test_study_with_heads_and_neurons(shared, tmp_path):
    """experiment=study with prune.unit=[head,ffn]: its head-only orders and single-unit stages are left out, the rest run."""
    from headprune.experiments import study

    cfg = make_cfg(
        tmp_path,
        "study",
        "nli",
        "study.train=false",
        "prune.unit=[head,ffn]",
        "prune.order=[importance,random]",
        "prune.fractions=[0,0.3]",
        *SMALL_SPEED,
    )
    from headprune.validation import validate

    validate(cfg)
    study.run(cfg)
    saved = json.loads((tmp_path / "results.json").read_text())["results"]
    assert "ablate" not in saved and "keep_one" not in saved
    assert set(saved["prune"]["orders"]) == {"importance", "random"} and saved["prune"]["unit"] == "head+ffn"
    assert "kinds_removed" in saved["prune"]["orders"]["importance"]["steps"][1]


def test_latency_costs_in_a_joint_unit_are_cached_per_unit(shared, tmp_path, monkeypatch):
    """prune.cost=latency with prune.unit=[head,ffn] reads tables of both kinds (cached in the run dir under the unit)."""
    from headprune.core.units import unit_gates
    from headprune.selection import latency
    from headprune.selection.costs import CostModel

    groups = unit_gates(shared["nli"].gates, "head+ffn").groups

    def steady_tables(model, inputs, unit, **kwargs):  # a tiny model's timings are noise: seconds growing with units kept
        assert unit == "head+ffn"
        return CostModel("seconds", 1.0, {g: torch.arange(n + 1.0).clamp(min=1).repeat(layers, 1) / n for g, (layers, n) in groups.items()})

    monkeypatch.setattr(latency, "measure_unit_latency_model", steady_tables)
    got = run(tmp_path, "prune", "nli", "prune.unit=[head,ffn]", "prune.target={speedup:1.2}", "prune.cost=latency", "prune.seq_len=16")
    point = got["results"]["points"][1]
    assert list((tmp_path / "latency").glob("latency-*-head+ffn-*.json"))
    assert point["cost_unit"] == "seconds" and point["predicted_speedup"] >= 1.2


@pytest.mark.parametrize(("task", "unit"), [("lm", "[kv_group,ffn]"), ("nli", "[head,ffn]"), ("nli", "ffn")])
def test_rearrangement_in_units_with_neurons_is_the_direct_call(shared, tmp_path, task, unit):
    """prune.rearrange=both with neurons in the unit: the rearranged point keeps every layer's count of each kind, is
    rearrange_unit_mask of the plain point's mask called directly on the task's gate gradients, and never raises the form."""
    from headprune.selection.unit_rearrange import example_gradients, rearrange_unit_mask
    from headprune.tasks.unit_task import in_unit

    got = run(tmp_path, "prune", task, f"prune.unit={unit}", "prune.order=fisher", "prune.fractions=[0.3]", "prune.rearrange=both")
    plain, moved = got["results"]["points"][1:]
    assert (plain["rearranged"], moved["rearranged"]) == (False, True) and moved["order"] == "fisher"
    for group, rows in plain["mask"].items():
        assert [sum(r) for r in rows] == [sum(r) for r in moved["mask"][group]]  # each layer keeps its count
    info = moved["rearrangement"]
    assert info["fisher_form_after"] <= info["fisher_form_before"] * (1 + 1e-9)

    view = in_unit(shared[task], unit.strip("[]").split(","))
    grads = example_gradients(view.model, view.gates, view.importance_batches(), unit=view.gates.unit)
    start = {g: torch.tensor(rows, dtype=torch.float32) for g, rows in plain["mask"].items()}
    direct = rearrange_unit_mask(start, grads, view.gates.unit, present=view.gates.present())
    assert {g: m.tolist() for g, m in direct.mask.items()} == {
        g: [[float(v) for v in r] for r in rows] for g, rows in moved["mask"].items()
    }
    assert sum(float(v.sum()) for v in direct.after.values()) == pytest.approx(info["fisher_form_after"], rel=1e-9)


@pytest.mark.parametrize(("order", "rule"), [("importance", "relative"), ("fisher", "loss")])
def test_a_joint_target_and_fraction_rank_the_kinds_by_prune_joint_scale(shared, tmp_path, order, rule):
    """The prune experiment's joint masks are the selection functions' masks of the scores made comparable by
    prune.joint_scale: the cost-aware search for a FLOPs target, the ranking for a fraction."""
    from headprune.selection.joint_scale import comparable_scores
    from headprune.selection.mask_search import search_mask
    from headprune.selection.uniform import layout_mask
    from headprune.selection.unit_costs import unit_flops_cost_model
    from headprune.sources.orders import order_scores, order_settings
    from headprune.tasks.unit_task import in_unit

    settings = ("prune.unit=[kv_group,ffn]", f"prune.order={order}", f"prune.joint_scale={rule}")
    target = run(tmp_path / "target", "prune", "lm", *settings, "prune.target={flops:0.7}", "prune.seq_len=32")["results"]
    fraction = run(tmp_path / "fraction", "prune", "lm", *settings, "prune.fractions=[0.3]")["results"]

    view = in_unit(shared["lm"], ["kv_group", "ffn"])
    scores = order_scores(view, order, order_settings(make_cfg(tmp_path, "prune", "lm", *LM, *settings)))
    costs = unit_flops_cost_model(view.model, view.gates.unit, seq_len=32)
    searched = search_mask(comparable_scores(scores, rule, costs), costs, {"flops": 0.7}).mask
    ranked = layout_mask(comparable_scores(scores, rule), view.gates.groups, 0.3)
    assert {g: m.tolist() for g, m in searched.items()} == target["points"][1]["mask"]
    assert {g: m.tolist() for g, m in ranked.items()} == fraction["orders"][order]["steps"][0]["mask"]


def test_kv_groups_and_neurons_exported_for_vllm_and_checked_without_headprune(shared, tmp_path):
    """experiment=export export.format=deci_hf on a [kv_group,ffn] mask (one KV group and no FFN in layer 0, no attention and
    20 neurons in layer 1): the DeciLM checkpoint passes the check in a fresh interpreter (the torch forward of its
    block_configs against the masked model, the tokenizer, greedy tokens), its layout the mask's kept counts."""
    mask = {"dec_self": [[1, 0], [0, 0]], "dec_ffn": [[0] * 64, [1] * 20 + [0] * 44]}
    (tmp_path / "mask.json").write_text(json.dumps({"mask": mask}))
    overrides = ("export.format=deci_hf", f"export.mask_file={tmp_path / 'mask.json'}", "prune.unit=[kv_group,ffn]")
    check = run(tmp_path / "export", "export", "lm", *overrides)["results"]["check"]
    assert check["passed"] and check["reader"] == "torch reference" and check["tokenizer_equal"] and check["greedy_equal"]
    assert check["layout"] == [{"heads": 4, "kv_heads": 1, "ffn": 0}, {"heads": 0, "kv_heads": 0, "ffn": 20}]
    folder = tmp_path / "export" / "export" / "deci_hf"
    assert (folder / "configuration_decilm.py").is_file() and not (folder / "__pycache__").exists()
