"""GGUF rows of falcon and olmo2 (llama.cpp's falcon and olmo2): the file's logits (numpy reader) against the model's,
unpruned, FFN-pruned and layer-pruned; Falcon's fused q/k/v as llama.cpp reads it; what llama.cpp's graphs do not compute,
and pruned heads, refused before work (the command line: exit 2, one line, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from cli_runs import headprune

from headprune.core.checks import ConfigError
from headprune.export import export_model
from headprune.export.gguf import refusal
from headprune.export.gguf_numpy import GGUFDecoder

TEXTS = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
PRE = "gpt-2"
SHAPES = {  # hidden 32, 4 query heads of 8, FFN 64, 3 layers
    "falcon": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, ffn_hidden_size=64, alibi=False, bias=False),
    "olmo2": dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64),
}
LAYOUTS = {  # Falcon's three q/k/v layouts: one KV head (multi-query), 2 KV groups (new_decoder_architecture), a KV per head
    "multi-query": {},
    "grouped": {"new_decoder_architecture": True, "num_kv_heads": 2},
    "per-head": {"multi_query": False},
    "olmo2": {},
}


def _tokenizer():
    from headprune.models.tokenizers import train_tokenizer

    return train_tokenizer(TEXTS * 5, vocab_size=300)


def _model(family: str, tokenizer, case: str = "unpruned", **fields):
    """A random ``family`` model (norms and their biases away from 1 and 0), pruned by ``case``: ``ffn`` (every FFN cut to
    40 of 64 neurons), ``layer`` (layer 1 removed), ``heads`` (query head 1 of layer 0)."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.activations import ACT2FN

    from headprune.core.units import prune_unit_mask, unit_gates

    torch.manual_seed(0)
    config = AutoConfig.for_model(family, vocab_size=len(tokenizer), max_position_embeddings=64, **SHAPES[family], **fields)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name or ".ln_" in name:
                param.normal_(0, 0.3).add_(1.0 if name.endswith("weight") else 0.0)
    if family == "falcon":  # llama.cpp's tanh GELU (the exact one differs by ~1e-6 here)
        model.config.activation = "gelu_pytorch_tanh"
        for layer in model.transformer.h:
            layer.mlp.act = ACT2FN["gelu_pytorch_tanh"]
    if case == "unpruned":
        return model
    gates = unit_gates(model, "head" if case == "heads" else ["ffn", "layer"])
    mask = gates.ones()
    if case == "ffn":
        mask["dec_ffn"][:, 40:] = 0.0
    elif case == "layer":
        mask["dec_layer"][1, 0] = 0.0
    else:
        mask["dec_self"][0, 1] = 0.0
    prune_unit_mask(gates, mask)
    gates.remove()
    return model


CASES = [(layout, case) for layout in LAYOUTS for case in ("unpruned", "ffn", "layer")]


@pytest.mark.parametrize(("layout", "case"), CASES, ids=[f"{layout}-{case}" for layout, case in CASES])
def test_gguf_logits_and_layout_read_back(layout, case, tmp_path):
    import gguf

    family = "olmo2" if layout == "olmo2" else "falcon"
    tokenizer = _tokenizer()
    model = _model(family, tokenizer, case, **LAYOUTS[layout])
    exported = export_model("gguf", model, tokenizer, tmp_path, {}, tokenizer_pre=PRE)
    assert exported["architecture"] == family and exported["job"]["reader"] == "gguf-numpy"
    reader = gguf.GGUFReader(str(exported["files"][0]))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    kv_heads = {"multi-query": 1, "grouped": 2, "per-head": 4, "olmo2": 2}[layout]
    assert (field(f"{family}.block_count"), field(f"{family}.feed_forward_length")) == (
        2 if case == "layer" else 3,
        40 if case == "ffn" else 64,
    )
    assert (field(f"{family}.attention.head_count"), field(f"{family}.attention.head_count_kv")) == (4, kv_heads)
    written = {t.name for t in reader.tensors}
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[family.upper()]]}
    assert {name.rsplit(".", 1)[0].replace(f"blk.{name.split('.')[1]}.", "blk.{bid}.") for name in written} <= known
    assert ("blk.0.attn_norm_2.weight" in written) == (layout == "grouped")  # ln_attn beside ln_mlp (attn_norm)
    assert ("output.weight" in written) == (family == "olmo2")  # falcon ties it to the embeddings; llama.cpp's olmo2 needs it
    ids = torch.tensor([tokenizer(text)["input_ids"] for text in TEXTS[:2]])
    with torch.no_grad():
        reference = model(input_ids=ids).logits.numpy()
    got = GGUFDecoder(str(exported["files"][0])).logits(ids.numpy())
    assert np.abs(got - reference).max() <= 1e-5 * max(1.0, float(np.abs(reference).max()))


def test_falcon_grouped_query_key_value_is_written_as_llama_cpp_reads_it(tmp_path):
    """Per KV group [q | q | k | v] in HF, all q rows | all k rows | all v rows in the file (convert_hf_to_gguf's FalconModel)."""
    import gguf

    tokenizer = _tokenizer()
    model = _model("falcon", tokenizer, **LAYOUTS["grouped"])
    path = export_model("gguf", model, tokenizer, tmp_path, {}, tokenizer_pre=PRE)["files"][0]
    stored = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(path)).tensors}["blk.0.attn_qkv.weight"]
    fused = model.transformer.h[0].self_attention.query_key_value.weight.detach().numpy()  # (2 groups x [q q k v] x 8, 32)
    query_head_3 = fused[32 + 8 : 32 + 16]  # group 1's second query head
    key_of_group_1, value_of_group_0 = fused[32 + 16 : 32 + 24], fused[24:32]
    assert np.array_equal(stored[24:32], query_head_3)
    assert np.array_equal(stored[32 + 8 : 32 + 16], key_of_group_1) and np.array_equal(stored[48:56], value_of_group_0)


def test_gguf_refuses_falcon_with_pruned_query_heads_before_writing(tmp_path):
    tokenizer = _tokenizer()
    model = _model("falcon", tokenizer, "heads")  # multi-query: any query head can go
    with pytest.raises(ConfigError, match=r"llama.cpp's falcon, whose graph reads q, k and v as blocks.*use export.format=onnx"):
        export_model("gguf", model, tokenizer, tmp_path / "out", {}, tokenizer_pre=PRE)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("fields", "found"),
    [
        ({"alibi": True}, "ALiBi positions"),
        ({"parallel_attn": False}, "one after the other (parallel_attn false)"),
        ({"bias": True}, "biases on query_key_value"),
        ({"activation": "relu"}, "the activation relu, not GELU"),
        ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}}, "rotary scaling"),
    ],
)
def test_gguf_refuses_falcon_configs_llama_cpp_computes_otherwise(fields, found):
    why = refusal({"model_type": "falcon", **fields})
    assert found in why and why.endswith("use export.format=onnx") and "\n" not in why


def test_gguf_takes_falcon_and_olmo2_configs_llama_cpp_computes():
    tokenizer = _tokenizer()
    for family, layout in (("falcon", "multi-query"), ("falcon", "grouped"), ("olmo2", "olmo2")):
        assert refusal(_model(family, tokenizer, **LAYOUTS[layout]).config.to_dict()) is None
    assert refusal({"model_type": "olmo2", "attention_bias": True}).endswith("use export.format=hf or onnx")


def test_gguf_refuses_only_families_llama_cpp_has_no_architecture_for():
    from headprune.export.gguf import GGUF_TYPES

    assert {"falcon", "olmo2"} <= set(GGUF_TYPES)
    assert "not 'opt'" in refusal({"model_type": "opt"})


MASK_HEADS = {"mask": {"dec_self": [[1, 1, 0, 0], [1, 1, 1, 1]]}}
COMMAND = ["experiment=export", "export.format=gguf", "export.tokenizer_pre=gpt-2", "data=lm_synthetic", "logger=none"]


@pytest.mark.parametrize(
    ("model", "extra", "words"),
    [
        ("tiny_falcon", [], "export.format=gguf writes falcon as llama.cpp's falcon, whose graph reads q, k and v as blocks"),
        ("tiny_falcon", ["model.config.bias=true"], "this model has biases on query_key_value, dense and the FFN"),
        ("tiny_olmo2", [], "olmo2 attention normalises all heads together"),
    ],
    ids=["falcon-query-heads", "falcon-biases", "olmo2-query-heads"],
)
def test_export_command_refuses_in_one_line_before_writing(capsys, monkeypatch, tmp_path, model, extra, words):
    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps(MASK_HEADS))
    run_dir = tmp_path / "run"
    status, err = headprune(capsys, monkeypatch, tmp_path, run_dir, *COMMAND, f"model={model}", f"export.mask_file={mask}", *extra)
    errors = [line for line in err.splitlines() if line.startswith("headprune: error:")]
    assert status == 2 and len(errors) == 1 and words in errors[0], err[-2000:]
    assert "Traceback" not in err and not (run_dir / "export").exists()
