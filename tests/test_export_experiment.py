"""experiment=export through the real config (mask files, saved models, every format) and speed.runtime=onnxruntime."""

from __future__ import annotations

import json

import pytest
import torch
from experiment_helpers import make_cfg, results

from headprune.core.checks import ConfigError

LM = ["data.tokenizer.vocab_size=300"]  # the GGUF tokenizer needs BPE merges (a vocabulary beyond single bytes)


def named_pre(fmt: str) -> list[str]:
    """A tokenizer the test task trains has no name llama.cpp knows: a GGUF export names its byte-level splitting."""
    return ["export.tokenizer_pre=gpt-2"] if fmt == "gguf" else []


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    """The LM, NLI and MT test tasks, loaded once."""
    from headprune.tasks import registry

    torch.set_num_threads(1)
    out = {}
    for name, extra in (("lm", LM), ("nli", []), ("mt", [])):
        out[name] = registry.load_task(make_cfg(tmp_path_factory.mktemp(name), "ablate", name, *extra))
    return out


@pytest.fixture
def shared(tasks, monkeypatch):
    """Every experiment reuses the loaded task of its model's kind, seen in the config's prune.unit."""
    from headprune.tasks import registry
    from headprune.tasks.unit_task import in_unit, unit_of

    by_kind = {"causal_lm": "lm", "classifier": "nli", "seq2seq": "mt"}
    monkeypatch.setattr(registry, "load_task", lambda cfg: in_unit(tasks[by_kind[cfg.model.kind]], unit_of(cfg)))
    return tasks


def run(tmp_path, experiment: str, task: str, *overrides) -> dict:
    from hydra.utils import get_method

    from headprune.validation import validate

    cfg = make_cfg(tmp_path, experiment, task, *(LM if task == "lm" else []), *overrides)
    validate(cfg)
    get_method(cfg.run)(cfg)
    return results(tmp_path)


@pytest.fixture
def lm_masks(shared, tmp_path):
    """A prune run of the LM task: uniform KV-group masks (stock shapes) and global query-head masks (uneven)."""
    run(tmp_path / "uniform", "prune", "lm", "prune.unit=kv_group", "prune.layout=uniform", "prune.fractions=[0,0.5]")
    uneven = run(tmp_path / "global", "prune", "lm", "prune.order=random", "prune.fractions=[0,0.25]")
    assert uneven["results"]["orders"]["random"]["steps"][1]["mask"]["dec_self"][0].count(0) == 2  # both of layer 0's removals
    return tmp_path / "uniform" / "results.json", tmp_path / "global" / "results.json"


@pytest.mark.parametrize("fmt", [pytest.param("hf", marks=pytest.mark.slow), "onnx", pytest.param("gguf", marks=pytest.mark.slow)])
def test_uniform_kv_group_lm_export_in_every_format(lm_masks, tmp_path, fmt):
    payload = run(
        tmp_path,
        "export",
        "lm",
        "prune.unit=kv_group",
        f"export.format={fmt}",
        *named_pre(fmt),
        f"export.mask_file={lm_masks[0]}",
        "export.fraction=0.5",
        "export.examples=8",
        "export.batch_size=4",
    )
    result = payload["results"]
    assert result["format"] == fmt and result["check"]["passed"] and result["check"]["greedy_equal"]
    assert result["check"]["max_abs_diff"] <= 1e-5 * max(1.0, result["check"]["reference_max_abs"])
    assert result["heads_per_layer"] == [[2, 1]] and result["unit"] == "kv_group"
    assert payload["inputs"]["mask_file"] == str(lm_masks[0]) and payload["inputs"]["format"] == fmt
    assert all((tmp_path / f).is_file() for f in result["files"])


def test_onnx_and_gguf_deci_take_an_uneven_global_mask_that_hf_refuses_before_any_work(lm_masks, tmp_path, monkeypatch):
    from headprune.validation import validate

    cfg = make_cfg(
        tmp_path / "hf",
        "export",
        "lm",
        *LM,
        "export.format=hf",
        f"export.mask_file={lm_masks[1]}",
        "export.mask_order=random",
        "export.fraction=0.25",
    )
    with pytest.raises(ConfigError, match="prune.layout=uniform.*export.format=onnx.*save_pruned"):
        validate(cfg)
    for fmt in ("onnx", "gguf"):
        result = run(
            tmp_path / fmt,
            "export",
            "lm",
            f"export.format={fmt}",
            *named_pre(fmt),
            f"export.mask_file={lm_masks[1]}",
            "export.mask_order=random",
            "export.fraction=0.25",
            "export.examples=8",
            "export.batch_size=4",
        )["results"]
        assert result["check"]["passed"] and [heads for heads, _ in result["heads_per_layer"]] == [2, 4]  # layers differ
    assert result["check"]["architecture"] == "deci" and result["check"]["layout_equal"] and result["check"]["greedy_equal"]


def test_refusals_are_config_errors_before_any_work(shared, lm_masks, tmp_path, monkeypatch):
    from headprune.tasks import registry
    from headprune.validation import validate

    monkeypatch.setattr(registry, "load_task", lambda cfg: pytest.fail("validation loaded the task"))
    cases = [
        ("nli", ["export.format=hf", "export.mask_file=" + str(lm_masks[0])], "export.format=onnx"),  # BERT: no stock config
        ("lm", ["export.format=onnx"], "export.mask_file=.*export.model="),  # no source
        ("lm", ["export.format=hf", "export.quantize=int8", f"export.mask_file={lm_masks[0]}"], "export.format=onnx"),
        ("mt", ["export.format=onnx", "export.quantize=int8", f"export.mask_file={lm_masks[0]}"], "seq2seq"),
        ("lm", ["export.format=tflite", f"export.mask_file={lm_masks[0]}"], "export.format"),
        ("lm", ["export.format=onnx", f"export.model={tmp_path}"], "no model directory"),
        ("nli", ["export.quantize=int8", f"export.mask_file={lm_masks[0]}", "export.int8_batch_sizes=[0,4]"], "export.int8_batch_sizes"),
    ]
    for task, overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            validate(make_cfg(tmp_path / "cfg", "export", task, *overrides))


@pytest.mark.slow  # a fresh load of the saved model and a transformers interpreter: about 10 s
def test_a_model_saved_by_save_pruned_is_exported_as_it_is(tasks, tmp_path):
    import copy

    from headprune.core.pruning import prune_kv_groups
    from headprune.core.saving import save_pruned

    task = tasks["lm"]
    model = copy.deepcopy(task.model)
    record = prune_kv_groups(model, {"dec_self": {0: [1], 1: [0]}})
    save_pruned(model, tmp_path / "saved", tokenizer=task.tokenizer)
    payload = run(
        tmp_path / "out",
        "export",
        "lm",
        "export.format=gguf",
        *named_pre("gguf"),
        f"export.model={tmp_path / 'saved'}",
        "export.examples=8",
        "export.batch_size=4",
    )
    result = payload["results"]
    assert result["check"]["passed"] and result["check"]["tokenizer_equal"] and result["mask"] is None
    assert payload["inputs"]["model"] == str(tmp_path / "saved") and payload["inputs"]["pruning_record"] == record


def test_onnx_int8_is_checked_by_the_task_metric_beside_f32(shared, tmp_path):
    masks = run(tmp_path / "prune", "prune", "nli", "prune.fractions=[0,0.5]")
    assert masks["results"]["orders"]["importance"]["steps"][1]["units_removed"] == 4
    result = run(
        tmp_path / "export",
        "export",
        "nli",
        "export.format=onnx",
        "export.quantize=int8",
        f"export.mask_file={tmp_path / 'prune' / 'results.json'}",
        "export.examples=8",
        "export.batch_size=4",
    )["results"]
    quantized = result["quantized"]
    assert result["check"]["passed"] and quantized["metric"] == "accuracy"
    assert quantized["onnx_f32"] == pytest.approx(quantized["masked_torch"], abs=100 / 60 + 1e-9)  # at most one of 60 examples flips
    assert 0 <= quantized["onnx_int8"] <= 100 and quantized["bytes"]["int8"] < quantized["bytes"]["f32"]
    assert (tmp_path / "export" / "export" / "onnx" / "int8" / "model.onnx").is_file()
    assert "int8/tokenizer.json" in quantized["files"] and "int8/config.json" in quantized["files"]  # self-contained
    assert_spread_per_batch_size(quantized, [1, 4, 16, 64], 100 / 60)  # the speed stage's batch sizes (conf/speed)


def assert_spread_per_batch_size(quantized: dict, sizes: list[int], one_example: float) -> None:
    """One score per batch size for f32 and int8, and min/max/spread that agree with those scores."""
    for name in ("f32", "int8"):
        record = quantized["by_batch_size"][name]
        assert record["batch_sizes"] == sizes and len(record["scores"]) == len(sizes)
        assert (record["min"], record["max"]) == (min(record["scores"]), max(record["scores"]))
        assert record["spread"] == pytest.approx(record["max"] - record["min"], abs=1e-12)
    f32 = quantized["by_batch_size"]["f32"]["scores"]  # f32 moves only by float rounding: at most one example flips
    assert all(abs(score - quantized["onnx_f32"]) <= one_example + 1e-9 for score in f32)


def test_lm_onnx_int8_is_scored_at_each_batch_size(shared, tmp_path):
    run(tmp_path / "prune", "prune", "lm", "prune.fractions=[0,0.25]")
    result = run(
        tmp_path / "export",
        "export",
        "lm",
        "export.format=onnx",
        "export.quantize=int8",
        f"export.mask_file={tmp_path / 'prune' / 'results.json'}",
        "export.fraction=0.25",
        "export.examples=4",
        "export.batch_size=2",
        "speed.batch_sizes=[1,3]",
    )["results"]
    quantized = result["quantized"]
    assert quantized["metric"] == "perplexity" and quantized["by_batch_size"]["int8"]["batch_sizes"] == [1, 3]
    f32 = quantized["by_batch_size"]["f32"]["scores"]
    assert max(f32) - min(f32) <= 1e-4 * quantized["onnx_f32"]  # perplexity of the f32 export: batching moves only rounding
    assert all(s > 0 for s in quantized["by_batch_size"]["int8"]["scores"])


def test_seq2seq_onnx_export_of_encoder_and_decoder(shared, tmp_path):
    run(tmp_path / "prune", "prune", "mt", "prune.fractions=[0,0.5]")
    result = run(
        tmp_path / "export",
        "export",
        "mt",
        "export.format=onnx",
        f"export.mask_file={tmp_path / 'prune' / 'results.json'}",
        "export.examples=8",
        "export.batch_size=4",
    )["results"]
    names = {f.split("/")[-1] for f in result["files"]}
    assert result["check"]["passed"] and sorted(n for n in names if n.endswith(".onnx")) == ["decoder.onnx", "encoder.onnx"]
    assert {"config.json", "generation_config.json", "tokenizer.json", "headprune_export.json"} <= names  # self-contained


@pytest.mark.parametrize("task", ["nli", "lm"])
def test_speed_in_onnx_runtime_times_both_exports_with_the_same_verdicts(shared, tmp_path, task):
    result = run(
        tmp_path,
        "speed",
        task,
        "speed.runtime=onnxruntime",
        "speed.batch_sizes=[4]",
        "speed.examples=8",
        "speed.repeats=2",
        "speed.max_repeats=2",
        "speed.max_seconds=60",  # a budget a loaded machine does not run out of: two timed rounds, no adaptive ones
        "speed.warmup=1",
    )["results"]
    runtime = result["runtime"]
    assert runtime["name"] == "onnxruntime" and max(runtime["max_abs_diff"].values()) < 1e-4
    assert (tmp_path / "onnx" / "pruned" / "model.onnx").is_file() and (tmp_path / "onnx" / "original" / "model.onnx").is_file()
    timed = {row["call"] for row in result["rows"]}
    assert timed == ({"forward"} if task == "nli" else {"prefill"})
    assert list(runtime["calls_not_timed"]) == ([] if task == "nli" else ["decode"])
    assert all(row["verdict"] in ("confident", "inconclusive") and row["repeats"] >= 2 for row in result["rows"])
    assert json.dumps(result)  # results.json holds it


@pytest.mark.slow
def test_embedded_smollm2_one_kv_group_of_three_removed_in_every_layer_is_a_stock_checkpoint(tmp_path):
    """The real SmolLM2-135M: uniform KV-group pruning -> 6 query heads over 2 KV heads in all 30 layers, a stock LlamaForCausalLM."""
    pytest.importorskip("gguf")
    from headprune.models import embedded

    try:
        embedded.gguf_file("smollm2")
    except ModuleNotFoundError as err:
        pytest.skip(str(err))
    small = [
        "model=smollm2",
        "data=lm_synthetic",
        "data.synthetic.sizes.eval=8",
        "data.synthetic.sizes.importance=8",
        "data.synthetic.sizes.heldout=4",
        "prune.unit=kv_group",
    ]
    from hydra.utils import get_method

    from headprune.validation import validate

    def run_real(path, experiment, *overrides):
        from experiment_helpers import compose_cfg

        cfg = compose_cfg(path, [f"experiment={experiment}", *small, "logger=none", "device=cpu", *overrides])
        validate(cfg)
        get_method(cfg.run)(cfg)
        return results(path)

    run_real(tmp_path / "prune", "prune", "prune.layout=uniform", "prune.order=random", "prune.fractions=[0.34]")
    payload = run_real(
        tmp_path / "export",
        "export",
        "export.format=hf",
        f"export.mask_file={tmp_path / 'prune' / 'results.json'}",
        "export.mask_order=random",
        "export.fraction=0.34",
        "export.examples=4",
        "export.batch_size=4",
        "export.new_tokens=8",
    )
    result = payload["results"]
    assert result["check"]["passed"] and result["check"]["greedy_equal"] and result["check"]["tokenizer_equal"]
    assert result["check"]["architecture"] == "LlamaForCausalLM" and result["heads_per_layer"] == [[6, 2]]
    config = json.loads((tmp_path / "export" / "export" / "hf" / "config.json").read_text())
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"], config["num_hidden_layers"]) == (6, 2, 64, 30)
