"""An export records what it did: an unpruned model as unpruned, the model kind of its own directory, names llama.cpp
knows, a LoRA rank checked against the pruned projections, and what its client (llama.cpp for GGUF files) said of it."""

from __future__ import annotations

import copy

import pytest
import torch
from experiment_helpers import built_clients, make_cfg, results
from torch import nn

from headprune.core.checks import ConfigError

LM = ["data.tokenizer.vocab_size=300"]
GGUF = ["export.format=gguf", "export.tokenizer_pre=gpt-2"]  # the test tokenizer's byte-level splitting, by a name llama.cpp knows
CLIENTS = built_clients()
needs_llama_cpp = pytest.mark.skipif(CLIENTS is None, reason="llama.cpp is not built: make test-clients builds it into .clients/venv")


@pytest.fixture(scope="module")
def lm_task(tmp_path_factory):
    """The tiny Llama task (2 layers x 4 query heads over 2 KV heads, head_dim 8), loaded once."""
    from headprune.tasks import registry

    torch.set_num_threads(1)
    return registry.load_task(make_cfg(tmp_path_factory.mktemp("lm"), "ablate", "lm", *LM))


@pytest.fixture
def saved_llama(lm_task, tmp_path):
    """An unpruned tiny Llama saved by save_pruned."""
    from headprune.core.saving import save_pruned

    save_pruned(copy.deepcopy(lm_task.model), tmp_path / "saved", tokenizer=lm_task.tokenizer)
    return tmp_path / "saved"


def test_an_unpruned_directory_is_exported_and_recorded_as_unpruned(lm_task, saved_llama, tmp_path, monkeypatch):
    from hydra.utils import get_method

    from headprune.tasks import registry
    from headprune.validation import validate

    monkeypatch.setattr(registry, "load_task", lambda cfg: lm_task)
    cfg = make_cfg(
        tmp_path / "out",
        "export",
        "lm",
        *LM,
        "export.format=onnx",
        f"export.model={saved_llama}",
        "export.examples=4",
        "export.batch_size=4",
    )
    validate(cfg)
    get_method(cfg.run)(cfg)
    result = results(tmp_path / "out")
    assert result["results"]["pruned"] is False and result["inputs"]["pruned"] is False and result["results"]["pruning_record"] == {}
    assert result["results"]["model_type"] == "llama" and result["results"]["architecture"] == "LlamaForCausalLM"


def test_a_directory_of_another_kind_than_the_task_is_refused(saved_llama, tmp_path):
    from headprune.experiments import export

    cfg = make_cfg(tmp_path, "export", "nli", "export.format=onnx", f"export.model={saved_llama}")
    with pytest.raises(ConfigError, match=r"holds a LlamaForCausalLM \(llama, model.kind causal_lm\), but model=tiny_bert is a classifier"):
        export.check(cfg)


def test_only_pre_tokenizers_llama_cpp_knows_are_written():
    from headprune.export.gguf_pre import known_name

    assert known_name("llama-bpe") == "llama-bpe" and known_name("smollm") == "smollm"
    with pytest.raises(ConfigError, match="did you mean llama-bpe"):
        known_name("llama_bpe")
    with pytest.raises(ConfigError, match="is no pre-tokenizer llama.cpp knows"):
        known_name("banana")


def test_a_lora_rank_is_checked_against_the_pruned_projections(lm_task):
    from headprune.core.pruning import prune_kv_groups
    from headprune.lightning.lora import lora_targets, smallest_projection
    from headprune.stages.finetune_runs import check_lora_rank

    model = copy.deepcopy(lm_task.model)
    prune_kv_groups(model, {"dec_self": {0: [1], 1: [0]}})  # each layer keeps 1 KV head: k/v_proj 32 -> 8 features
    modules = dict(model.named_modules())
    widths = [min(m.in_features, m.out_features) for name, m in modules.items() if name in lora_targets(model) and isinstance(m, nn.Linear)]
    assert smallest_projection(model) == min(widths) == 8  # 1 KV head x head_dim 8
    assert smallest_projection(lm_task.model) == 16  # unpruned: 2 KV heads x 8, below the config check's view of it
    check_lora_rank(model, 8)
    with pytest.raises(ConfigError, match="lora_rank=16 is larger than the smallest projection of the pruned model \\(8 features"):
        check_lora_rank(model, 16)


def run_export(lm_task, tmp_path, monkeypatch, mask: dict, *overrides) -> dict:
    """experiment=export of ``mask`` (a mask JSON) on the tiny Llama task; its results.json."""
    import json

    from hydra.utils import get_method

    from headprune.tasks import registry
    from headprune.tasks.unit_task import in_unit, unit_of
    from headprune.validation import validate

    (tmp_path / "mask.json").write_text(json.dumps({"mask": mask}))
    monkeypatch.setattr(registry, "load_task", lambda cfg: in_unit(lm_task, unit_of(cfg)))
    cfg = make_cfg(
        tmp_path / "out",
        "export",
        "lm",
        *LM,
        f"export.mask_file={tmp_path / 'mask.json'}",
        "export.examples=4",
        "export.batch_size=4",
        *overrides,
    )
    validate(cfg)
    get_method(cfg.run)(cfg)
    return results(tmp_path / "out")["results"]


def test_a_deci_hf_export_of_a_query_head_mask_records_and_says_the_padded_heads(lm_task, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADPRUNE_CLIENTS", str(tmp_path / "no-clients"))
    result = run_export(lm_task, tmp_path, monkeypatch, {"dec_self": [[1, 0, 1, 1], [1, 1, 1, 1]]}, "export.format=deci_hf")
    assert result["padded_query_heads"] == [1, 0] and result["pruned"] is True
    assert result["widths_per_layer"][0]["heads"] == 3 and result["widths_per_layer"][0]["kv_heads"] == 2
    out = capsys.readouterr().out
    assert "1 removed query heads written back as zero heads (per layer [1, 0])" in out
    assert "vLLM CPU is not installed in" in result["client_check"]["skipped"]
    assert "[export] export.client_check: vLLM CPU is not installed" in out


def test_an_ffn_only_mask_is_recorded_as_pruned_with_its_widths_and_tensor_parallel_fit(lm_task, tmp_path, monkeypatch, capsys):
    width = int(lm_task.model.config.intermediate_size)
    rows = [[1] * (width - 3) + [0] * 3, [1] * width]  # layer 0 keeps an odd width
    result = run_export(lm_task, tmp_path, monkeypatch, {"dec_ffn": rows}, "export.format=onnx", "prune.unit=ffn")
    assert result["pruned"] is True and result["pruning_record"] == {}
    assert result["ffn_pruning_record"] == {"dec_ffn": {"0": [width - 3, width - 2, width - 1]}}
    assert [w["ffn"] for w in result["widths_per_layer"]] == [width - 3, width]
    fit = result["tensor_parallel"]
    assert fit["2"]["suits"] is False and fit["2"]["layers"] == [0] and "prune.ffn_multiple=2" in fit["2"]["hint"]
    assert "widths do not split for tensor parallelism of degree 2, 4, 8" in capsys.readouterr().out


def test_tensor_parallel_fit_follows_vllm_sharding():
    from headprune.export.record import splits_over, tensor_parallel

    assert splits_over({"heads": 8, "kv_heads": 2, "ffn": 64}, 4)  # 2 KV heads copied onto 4 GPUs
    assert not splits_over({"heads": 8, "kv_heads": 3, "ffn": 64}, 2)
    assert splits_over({"heads": 0, "kv_heads": 0, "ffn": 0}, 8)  # an emptied layer
    fit = tensor_parallel([{"heads": 4, "kv_heads": 2, "ffn": 64}, {"heads": 8, "kv_heads": 2, "ffn": 64}])["8"]
    assert fit["suits"] is False and fit["layers"] == [0] and "prune.ffn_multiple" not in fit["hint"]


def kv_group_masks(width: int) -> dict:
    """Masks of the tiny Llama (2 layers x 2 KV groups, ``width`` neurons): uniform KV groups (a llama file) and uneven
    KV groups and FFN widths (a deci file)."""
    return {
        "llama": ({"dec_self": [[1, 0], [0, 1]]}, "prune.unit=kv_group"),
        "deci": ({"dec_self": [[1, 0], [1, 1]], "dec_ffn": [[1] * (width - 24) + [0] * 24, [1] * width]}, "prune.unit=[kv_group,ffn]"),
    }


def test_a_gguf_export_says_llama_cpp_is_not_installed(lm_task, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HEADPRUNE_CLIENTS", str(tmp_path / "no-clients"))
    mask, unit = kv_group_masks(int(lm_task.model.config.intermediate_size))["llama"]
    result = run_export(lm_task, tmp_path, monkeypatch, mask, *GGUF, unit)
    assert result["check"]["passed"] and "llama.cpp is not installed in" in result["client_check"]["skipped"]
    assert "[export] export.client_check: llama.cpp is not installed" in capsys.readouterr().out


@needs_llama_cpp
@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("layout", ["llama", "deci"])
def test_a_gguf_export_runs_in_llama_cpp_and_equals_the_masked_model(lm_task, tmp_path, monkeypatch, layout, dtype):
    monkeypatch.setenv("HEADPRUNE_CLIENTS", str(CLIENTS))
    mask, unit = kv_group_masks(int(lm_task.model.config.intermediate_size))[layout]
    report = run_export(lm_task, tmp_path, monkeypatch, mask, *GGUF, unit, f"export.gguf_dtype={dtype}")["client_check"]
    rows = {row["check"]: row for row in report["rows"]}
    assert report["client"] == "llama.cpp" and report["passed"], report
    assert rows["architecture"]["detail"] == layout and f"{dtype} file" in rows["logprobs"]["detail"]


@needs_llama_cpp
def test_a_gguf_file_llama_cpp_computes_differently_fails_and_stays_out_of_export(lm_task, tmp_path, monkeypatch):
    from headprune.export import client_check

    monkeypatch.setenv("HEADPRUNE_CLIENTS", str(CLIENTS))
    arrays = client_check.greedy_arrays

    def shifted(*args):  # the masked model's log-probabilities moved by 1.0: what a file computing differently shows
        return {k: v + 1.0 if k.startswith("logprobs") else v for k, v in arrays(*args).items()}

    monkeypatch.setattr(client_check, "greedy_arrays", shifted)
    mask, unit = kv_group_masks(int(lm_task.model.config.intermediate_size))["deci"]
    with pytest.raises(ValueError, match=r"llama.cpp FAILED.*logprobs max \|diff\| 1\.00e\+00.*the previous one is kept"):
        run_export(lm_task, tmp_path, monkeypatch, mask, *GGUF, unit)
    assert not (tmp_path / "out" / "export").exists() and (tmp_path / "out" / ".export.next" / "check.json").is_file()
