"""LLM recovery on tiny Llama / Qwen2 models: LoRA merged back into a plain (pruned) model, causal-LM distillation over
real tokens only, token budgets, the unpruned control on identical batches, KV groups with targets, schedules and
recovery end to end, and the bad settings that must fail before any work."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from experiment_helpers import make_cfg, results, task_fixtures
from tiny_llms import tiny_llama, tiny_qwen2
from torch import nn

from headprune.core.attention.gates import HeadGates
from headprune.core.masks import kv_to_head_mask
from headprune.core.pruning import prune_kv_groups, prune_mask, pruning_record
from headprune.experiments import prune
from headprune.lightning.finetune import (
    RecoveryModule,
    distillation_loss,
    finetune_recover,
)
from headprune.lightning.lora import lora_targets
from headprune.tasks.lm.data import collate

TASK = "lm"
task, shared_task = task_fixtures(TASK)
MODELS = {"llama": tiny_llama, "qwen2": tiny_qwen2}


def text_batches(n: int = 3, rows: int = 4, vocab: int = 64, seed: int = 0) -> list[dict]:
    """Right-padded texts of ragged lengths with next-token labels, as headprune's LM data makes them."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        lengths = torch.randint(4, 12, (rows,), generator=gen).tolist()
        out.append(collate([torch.randint(3, vocab, (k,), generator=gen).tolist() for k in lengths], pad_id=0))
    return out


def inputs(batch: dict) -> dict:
    return {k: batch[k] for k in ("input_ids", "attention_mask")}


def kv_mask_of(model, removed: list[tuple[int, int]]) -> dict:
    """A KV-group mask {dec_self: [layers, KV]} with the (layer, KV head) pairs removed, and its query-head mask."""
    gates = HeadGates(model)
    layers, kv = gates.kv_groups["dec_self"]
    mask = torch.ones(layers, kv)
    for layer, head in removed:
        mask[layer, head] = 0
    return {"dec_self": mask}, kv_to_head_mask({"dec_self": mask}, gates.heads_per_kv)


# ---- LoRA ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_lora_changes_only_the_adapted_projections_and_merges_into_a_plain_model(name):
    """LoRA under a KV-group mask: only adapted weights move, no peft module is left, and the merged model's masked and
    physically pruned twins agree."""
    model = MODELS[name]()
    teacher = copy.deepcopy(model)
    _, heads = kv_mask_of(model, [(0, 1), (1, 0)])
    gates = HeadGates(model)
    batch = text_batches(1, seed=5)[0]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad(), gates.masked(heads):
        start = model(**inputs(batch)).logits
    gates.set_mask(heads)
    history = finetune_recover(
        model, text_batches(), teacher=teacher, distill_weight=0.5, max_steps=4, lr=1e-2, lora_rank=4, accelerator="cpu"
    )
    gates.set_mask(None)
    assert len(history) == 4
    after = model.state_dict()
    assert set(after) == set(before)  # no adapter weights left behind
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    adapted = {f"{t}.weight" for t in lora_targets(model)}
    assert changed and changed <= adapted
    assert max(float((after[k] - before[k]).abs().max()) for k in changed) > 1e-3
    modules = dict(model.named_modules())
    assert all(type(modules[t]) is nn.Linear for t in lora_targets(model))
    assert not any(type(m).__module__.startswith("peft") for m in model.modules())
    assert all(p.requires_grad for p in model.parameters())
    pruned = copy.deepcopy(model)
    prune_mask(pruned, heads)
    with torch.no_grad(), gates.masked(heads):
        masked = model(**inputs(batch)).logits
    with torch.no_grad():
        physical = pruned(**inputs(batch)).logits
    assert float((masked - start).abs().max()) > 1e-3  # the adapters trained something
    valid = batch["attention_mask"].bool()
    torch.testing.assert_close(physical[valid], masked[valid], atol=1e-5, rtol=0)


def test_lora_recovery_of_a_pruned_model_keeps_its_record_and_saves_as_a_plain_pruned_model(tmp_path):
    from headprune.core.saving import load_pruned, save_pruned

    model = tiny_qwen2()
    teacher = copy.deepcopy(model)
    prune_kv_groups(model, {"dec_self": {0: [1]}})
    record = pruning_record(model)
    finetune_recover(model, text_batches(), teacher=teacher, distill_weight=0.5, max_steps=3, lr=1e-2, lora_rank=2, accelerator="cpu")
    assert pruning_record(model) == record and not HeadGates(model).present()["dec_self"][0, 3:].any()
    save_pruned(model, tmp_path / "recovered")
    loaded = load_pruned(tmp_path / "recovered")
    batch = text_batches(1, seed=7)[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs(batch)).logits, model(**inputs(batch)).logits, atol=1e-5, rtol=0)


# ---- distillation of a causal LM ------------------------------------------------------------------
def test_causal_lm_distillation_counts_only_real_tokens():
    """The KL of a padded batch equals the mean over each text alone, run without padding; prompt positions drop out."""
    temperature = 2.0
    student, teacher = tiny_llama(seed=0), tiny_llama(seed=1)
    texts = [[1, 5, 7, 9, 11], [1, 4, 6], [1, 8, 3, 12, 20, 30, 2]]
    batch = collate(texts, pad_id=0)
    module = RecoveryModule(student, teacher=teacher, distill_weight=1.0, temperature=temperature)

    def reference(skip: int = 0) -> torch.Tensor:  # each text alone; position t predicts token t + 1 (the last predicts nothing)
        kls = []
        for text in texts:
            ids = torch.tensor([text])
            with torch.no_grad():
                s = F.log_softmax(student(input_ids=ids).logits[0, skip:-1] / temperature, -1)
                t = F.log_softmax(teacher(input_ids=ids).logits[0, skip:-1] / temperature, -1)
            kls.append((t.exp() * (t - s)).sum(-1))
        return torch.cat(kls).mean() * temperature**2

    with torch.no_grad():
        _, distill, _ = module.losses(batch)
        expected = reference()
        assert float(expected) > 1e-3  # two different random models: clearly apart
        torch.testing.assert_close(distill, expected, rtol=1e-5, atol=0)
        repadded = {**batch, "input_ids": batch["input_ids"].masked_fill(batch["attention_mask"] == 0, 33)}
        torch.testing.assert_close(module.losses(repadded)[1], distill, rtol=1e-6, atol=0)  # padding content is never read
        every_position = distillation_loss(student(**inputs(batch)).logits, teacher(**inputs(batch)).logits, temperature)
        assert abs(float(every_position) - float(distill)) > 1e-3 * float(distill)  # counting padding would change it
        prompted = {**batch, "labels": batch["labels"].clone()}
        prompted["labels"][:, :1] = -100  # a one-token prompt in every text: its position is left out
        torch.testing.assert_close(module.losses(prompted)[1], reference(skip=1), rtol=1e-5, atol=0)


# ---- token budgets ---------------------------------------------------------------------------------
class FakeTask:
    """training_batches of 10 texts of 5 real tokens each, in batches of 2 rows."""

    def training_batches(self, examples: int, seed: int = 0) -> list[dict]:
        n = min(int(examples), 10)
        return [collate([[1, 2, 3, 4, 5]] * min(2, n - s), pad_id=0) for s in range(0, n, 2)]


def test_a_token_budget_takes_the_shortest_prefix_of_batches_that_holds_it():
    from headprune.stages.finetune_runs import batch_tokens, budget_batches

    for tokens, batches in ((1, 1), (10, 1), (11, 2), (50, 5)):
        chosen = budget_batches(FakeTask(), tokens, 0)
        assert len(chosen) == batches and sum(map(batch_tokens, chosen)) >= tokens
    with pytest.raises(ValueError, match="holds only 50 tokens"):
        budget_batches(FakeTask(), 51, 0)
    with pytest.raises(ValueError, match=">= 1 token"):
        budget_batches(FakeTask(), -5, 0)


# ---- the control and KV groups through the prune experiment -----------------------------------------------
def _spy_finetunes(monkeypatch) -> list[dict]:
    from headprune.stages import finetune_runs

    calls = []
    original = finetune_runs.finetune_recover

    def spy(model, batches, **kwargs):
        calls.append(
            {
                "record": pruning_record(model),
                "batches": [{k: v.clone() for k, v in b.items()} for b in batches],
                "teacher": kwargs["teacher"],
                "model": model,
                **{k: kwargs[k] for k in ("max_steps", "lr", "warmup", "decay", "lora_rank", "distill_weight", "temperature")},
            }
        )
        return original(model, batches, **kwargs)

    monkeypatch.setattr(finetune_runs, "finetune_recover", spy)
    return calls


def _same_batches(first: list[dict], second: list[dict]) -> bool:
    return len(first) == len(second) and all(
        a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a) for a, b in zip(first, second)
    )


def test_kv_group_target_with_every_recovery_and_the_control_on_identical_batches(shared_task, tmp_path, monkeypatch):
    from headprune.viz.tables import pareto_table

    calls = _spy_finetunes(monkeypatch)
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.unit=kv_group",
        "prune.order=fisher",
        "prune.target={speedup:1.05}",
        "prune.recover=[none,lsq,finetune]",
        "prune.control=true",
        "prune.finetune.tokens=200",
        "prune.finetune.lr=1e-3",
        "prune.finetune.decay=true",
        "prune.finetune.warmup=0.2",
        "prune.recover_examples=8",
        "prune.extra_splits=[heldout]",
    )
    prune.run(cfg)
    payload = results(tmp_path)
    out = payload["results"]
    points = out["points"]
    assert [(p["order"], p["recovery"], bool(p.get("control"))) for p in points] == [
        ("unpruned", "none", False),
        ("unpruned", "finetune", True),
        ("fisher", "none", False),
        ("fisher", "lsq", False),
        ("fisher", "finetune", False),
    ]
    for p in points[2:]:
        assert p["predicted_speedup"] >= 1.05 and len(p["mask"]["dec_self"][0]) == 2  # [layers, KV heads]
        assert p["query_heads_removed"] == 2 * p["units_removed"] > 0 and p["units_total"] == 4
        assert set(p["extra"]) == {"heldout"}
    pruned, control = calls
    assert pruned["record"] and not control["record"]  # the pruned copy, then the unpruned one
    assert "idx" in pruned["batches"][0] and _same_batches(pruned["batches"], control["batches"])  # same texts, same order
    assert {k: pruned[k] for k in ("max_steps", "lr", "warmup", "decay", "distill_weight")} == {
        k: control[k] for k in ("max_steps", "lr", "warmup", "decay", "distill_weight")
    }
    assert pruned["max_steps"] == len(pruned["batches"])  # a token budget trains one pass
    assert pruned["teacher"] is shared_task.model and control["teacher"] is not shared_task.model  # the control's own frozen copy
    assert control["model"] is not shared_task.model and len(points[1]["finetune_losses"]) == control["max_steps"]
    assert out["finetune"]["rounds"][0]["tokens"] >= 200 and out["control"] is True and out["unit"] == "kv_group"
    assert all(out["data"][s]["tokens"] > out["data"][s]["predicted_tokens"] > 0 for s in ("eval", "importance", "heldout", "train"))
    table = pareto_table(payload)
    assert "unpruned + same training" in table and "KV groups removed" in table and "on `heldout`" in table


def test_a_point_read_through_its_own_tokenizer_is_set_against_the_control_per_byte():
    """Its tokens are not the control's: per-token perplexities are not comparable, per-byte ones are."""
    from headprune.viz.tables import versus_control, with_control_scores

    control = {"order": "unpruned", "recovery": "finetune", "control": True, "score": 60.0, "perplexity_per_byte": 2.5}
    tuned = {"order": "fisher", "recovery": "finetune", "score": 90.0, "perplexity_per_byte": 2.75}
    own = {**tuned, "tokenizer": {"own": True, "compared_by": "bits_per_byte"}}
    same, cut = with_control_scores([control, tuned, own])[1:]
    assert versus_control(same, higher_is_better=False) == f"{100 * (90.0 / 60.0 - 1):+.1f}%"
    assert versus_control(cut, higher_is_better=False) == f"{100 * (2.75 / 2.5 - 1):+.1f}%"


def test_kv_group_schedule_with_lsq_and_finetune_prunes_nested_kv_groups(shared_task, tmp_path):
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.unit=kv_group",
        "prune.order=fisher",
        "prune.schedule=[0.25,0.5]",
        "prune.recover=[lsq,finetune]",
        "prune.finetune.max_steps=2",
        "prune.recover_examples=8",
        "prune.finetune.examples=8",
    )
    prune.run(cfg)
    points = results(tmp_path)["results"]["points"]
    assert [(p["recovery"], p["units_removed"]) for p in points] == [("none", 0), ("lsq", 1), ("lsq", 2), ("finetune", 1), ("finetune", 2)]
    for first, second in ((points[1], points[2]), (points[3], points[4])):
        assert all(a >= b for ra, rb in zip(first["mask"]["dec_self"], second["mask"]["dec_self"]) for a, b in zip(ra, rb))


def test_kv_group_rearrangement_keeps_each_layers_count(shared_task, tmp_path):
    cfg = make_cfg(
        tmp_path,
        "prune",
        TASK,
        "prune.unit=kv_group",
        "prune.order=importance",
        "prune.fractions=0.5",
        "prune.rearrange=both",
        "prune.min_units_per_layer=1",
    )
    prune.run(cfg)
    points = results(tmp_path)["results"]["points"]
    assert [p.get("rearranged") for p in points[1:]] == [False, True]
    counts = [[sum(row) for row in p["mask"]["dec_self"]] for p in points[1:]]
    assert counts[0] == counts[1] == [1, 1]  # one of the two KV groups kept in each layer, before and after


@pytest.mark.parametrize("name", list(MODELS))
def test_kv_group_flop_tables_predict_the_physically_pruned_model(name):
    from headprune.core.counting import model_cost
    from headprune.selection.unit_costs import unit_flops_cost_model

    model = MODELS[name]()
    costs = unit_flops_cost_model(model, "kv_group", seq_len=16)
    for removed in ([], [(0, 1)], [(0, 0), (0, 1)], [(0, 0), (1, 1)]):  # the third empties layer 0: its phantom head runs
        kv, heads = kv_mask_of(model, removed)
        pruned = copy.deepcopy(model)
        prune_mask(pruned, heads)
        assert costs.table_cost(kv) == pytest.approx(model_cost(pruned, 16).flops, rel=1e-12)


def test_the_control_of_an_nli_fine_tune_trains_on_the_same_batches(tmp_path, monkeypatch):
    from headprune.results.points import point_name

    calls = _spy_finetunes(monkeypatch)
    cfg = make_cfg(
        tmp_path,
        "prune",
        "nli",
        "prune.order=fisher",
        "prune.fractions=0.25",
        "prune.recover=finetune",
        "prune.control=true",
        "prune.finetune.max_steps=2",
        "prune.finetune.examples=16",
    )
    prune.run(cfg)
    points = results(tmp_path)["results"]["points"]
    assert [point_name(p) for p in points] == ["unpruned", "unpruned + same training", "fisher+finetune"]
    pruned, control = calls
    assert pruned["record"] and not control["record"] and _same_batches(pruned["batches"], control["batches"])


# ---- bad settings fail before any work ---------------------------------------------------------------
@pytest.mark.parametrize(
    "overrides, message",
    [
        (["prune.recover=finetune", "prune.finetune.tokens=-5"], "prune.finetune.tokens"),
        (["prune.recover=finetune", "prune.finetune.lora_rank=17"], "lora_rank=17 is larger than the smallest projection"),
        (["prune.recover=finetune", "prune.finetune.lora_rank=0"], "prune.finetune.lora_rank must be >= 1"),
        (["prune.recover=lsq", "prune.control=true"], "prune.control=true"),
        (["prune.control=true"], "prune.control=true"),
        (["prune.extra_splits=[eval]"], "repeats prune.split"),
        (["prune.extra_splits=[nope]"], "unknown split"),
    ],
)
def test_bad_recovery_settings_are_config_errors(tmp_path, overrides, message):
    from headprune.core.checks import ConfigError
    from headprune.validation import validate

    with pytest.raises(ConfigError, match=message):
        validate(make_cfg(tmp_path, "prune", TASK, *overrides))


def test_lm_splits_sharing_files_draw_other_lines_and_never_an_evaluated_text(tmp_path):
    from omegaconf import OmegaConf

    from headprune.tasks.lm.data import load_texts

    (tmp_path / "pool.en").write_text("".join(f"pool sentence {i}\n" for i in range(30)) + "shared sentence\n")
    (tmp_path / "eval.en").write_text("shared sentence\nonly evaluated\n")
    cfg = OmegaConf.create(
        {
            "source": "local",
            "dir": str(tmp_path),
            "seed": 0,
            "files": {"eval": ["eval.en"], "importance": ["pool.en"], "heldout": ["pool.en"], "train": ["pool.en"]},
            "limits": {"importance": 5, "heldout": 4, "train": None},
        }
    )
    texts = load_texts(cfg)
    assert len(texts["importance"]) == 5 and len(texts["heldout"]) == 4 and len(texts["train"]) == 31 - 1 - 5 - 4
    drawn = [t for split in ("importance", "heldout", "train") for t in texts[split]]
    assert len(set(drawn)) == len(drawn) == 30 and "shared sentence" not in drawn
