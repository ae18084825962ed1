"""GGUF rows of gpt2 and gpt_neox (llama.cpp's gpt2 and gptneox): the tensors and metadata read back with the gguf package,
the file's logits (numpy) against the model's, unpruned, FFN-pruned and layer-pruned, and the layouts refused before work."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_llms import tiny_family

from headprune.core.checks import ConfigError
from headprune.export import export_model
from headprune.export.gguf_numpy import GGUFDecoder

TEXTS = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
PRE = "gpt-2"


def _tokenizer():
    from headprune.models.tokenizers import train_tokenizer

    return train_tokenizer(TEXTS * 5, vocab_size=300)


def _model(family: str, tokenizer, case: str, **fields):
    """The tiny ``family`` model with llama.cpp's tanh GELU (the exact GELU differs by ~1e-6 here), pruned by ``case``:
    ``ffn`` (every FFN cut to 40 of 128 / 64 neurons), ``layer`` (layer 1 removed), ``heads`` (query head 1 of layer 0)."""
    from transformers.activations import ACT2FN

    from headprune.core.units import prune_unit_mask, unit_gates

    model = tiny_family(family) if not fields else _built(family, fields)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    if family == "gpt_neox":
        model.config.hidden_act = "gelu_pytorch_tanh"
        for layer in model.gpt_neox.layers:
            layer.mlp.act = ACT2FN["gelu_pytorch_tanh"]
    if case == "unpruned":
        return model
    unit = "head" if case == "heads" else ["ffn", "layer"]
    gates = unit_gates(model, unit)
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


def _built(family: str, fields: dict):
    """tiny_family's model of ``family`` with config ``fields`` its layers read when built (use_parallel_residual)."""
    from tiny_llms import DECODER_CONFIGS
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(family, **DECODER_CONFIGS[family], **fields)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.normal_(0, 0.3).add_(1.0 if "norm" in name and name.endswith("weight") else 0.0)
    return model


def _expected_tensors(family: str, layers: int, width: int, vocab: int) -> dict[str, list[int]]:
    """{GGUF tensor name: numpy shape} of a square gpt2 / gptneox file (hidden 32), by hand."""
    hidden = 32
    tensors = {"token_embd.weight": [vocab, hidden], "output_norm.weight": [hidden], "output_norm.bias": [hidden]}
    if family == "gpt2":
        tensors["position_embd.weight"] = [64, hidden]  # tied: no output matrix, llama.cpp reads token_embd
    else:
        tensors["output.weight"] = [vocab, hidden]
    for i in range(layers):
        layer = {
            "attn_norm.weight": [hidden],
            "attn_norm.bias": [hidden],
            "attn_qkv.weight": [3 * hidden, hidden],
            "attn_qkv.bias": [3 * hidden],
            "attn_output.weight": [hidden, hidden],
            "attn_output.bias": [hidden],
            "ffn_norm.weight": [hidden],
            "ffn_norm.bias": [hidden],
            "ffn_up.weight": [width, hidden],
            "ffn_up.bias": [width],
            "ffn_down.weight": [hidden, width],
            "ffn_down.bias": [hidden],
        }
        tensors.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
    return tensors


CASES = {  # family, case, model fields: (layers, FFN width)
    ("gpt2", "unpruned", ()): (3, 128),
    ("gpt2", "ffn", ()): (3, 40),
    ("gpt2", "layer", ()): (2, 128),
    ("gpt_neox", "unpruned", ()): (3, 64),
    ("gpt_neox", "ffn", ()): (3, 40),
    ("gpt_neox", "layer", ()): (2, 64),
    ("gpt_neox", "unpruned", (("use_parallel_residual", False),)): (3, 64),
}


@pytest.mark.parametrize(("family", "case", "fields"), list(CASES), ids=[f"{f}-{c}{'-sequential' if x else ''}" for f, c, x in CASES])
def test_gpt_gguf_tensors_metadata_and_logits_read_back(family, case, fields, tmp_path):
    import gguf

    layers, width = CASES[family, case, fields]
    architecture = "gpt2" if family == "gpt2" else "gptneox"
    tokenizer = _tokenizer()
    model = _model(family, tokenizer, case, **dict(fields))
    exported = export_model("gguf", model, tokenizer, tmp_path, {}, tokenizer_pre=PRE)
    assert exported["architecture"] == architecture and exported["job"]["reader"] == "gguf-numpy"
    reader = gguf.GGUFReader(str(exported["files"][0]))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == architecture
    assert (field(f"{architecture}.block_count"), field(f"{architecture}.feed_forward_length")) == (layers, width)
    assert field(f"{architecture}.attention.head_count") == field(f"{architecture}.attention.head_count_kv") == 4
    assert field(f"{architecture}.attention.layer_norm_epsilon") == pytest.approx(1e-5)
    if family == "gpt_neox":  # partial rotary 0.5 of a head of 8
        assert field("gptneox.rope.dimension_count") == 4
        assert field("gptneox.use_parallel_residual") == dict(fields).get("use_parallel_residual", True)
    else:
        assert "gpt2.rope.dimension_count" not in reader.fields
    written = {t.name: [int(n) for n in t.data.shape] for t in reader.tensors}
    assert written == _expected_tensors(family, layers, width, model.config.vocab_size)
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[architecture.upper()]]}
    assert {name.rsplit(".", 1)[0].replace(f"blk.{name.split('.')[1]}.", "blk.{bid}.") for name in written} <= known
    ids = torch.tensor([tokenizer(text)["input_ids"] for text in TEXTS[:2]])
    with torch.no_grad():
        reference = model(input_ids=ids).logits.numpy()
    got = GGUFDecoder(str(exported["files"][0])).logits(ids.numpy())
    assert np.abs(got - reference).max() <= 1e-5 * max(1.0, float(np.abs(reference).max()))


def test_neox_query_key_value_is_written_as_llama_cpp_reads_it(tmp_path):
    """Per head [q | k | v] in HF, all q rows | all k rows | all v rows in the file (convert_hf_to_gguf's GPTNeoXModel)."""
    import gguf

    tokenizer = _tokenizer()
    model = _model("gpt_neox", tokenizer, "unpruned")
    path = export_model("gguf", model, tokenizer, tmp_path, {}, tokenizer_pre=PRE)["files"][0]
    stored = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(str(path)).tensors}["blk.0.attn_qkv.weight"]
    fused = model.gpt_neox.layers[0].attention.query_key_value.weight.detach().numpy()  # (4 heads x [q|k|v] x 8, 32)
    query_head_2 = fused[2 * 24 : 2 * 24 + 8]
    value_head_3 = fused[3 * 24 + 16 : 3 * 24 + 24]
    assert np.array_equal(stored[16:24], query_head_2) and np.array_equal(stored[64 + 24 : 64 + 32], value_head_3)


@pytest.mark.parametrize("family", ["gpt2", "gpt_neox"])
def test_gguf_refuses_a_gpt_model_with_pruned_query_heads_before_writing(family, tmp_path):
    tokenizer = _tokenizer()
    model = _model(family, tokenizer, "heads")
    with pytest.raises(ConfigError, match=r"reads q, k and v as blocks of the hidden size \(32\).*use export.format=onnx"):
        export_model("gguf", model, tokenizer, tmp_path / "out", {}, tokenizer_pre=PRE)
    assert not (tmp_path / "out").exists()


def test_gguf_refuses_uneven_ffn_widths_of_gpt2(tmp_path):
    from headprune.core.units import prune_unit_mask, unit_gates

    tokenizer = _tokenizer()
    model = _model("gpt2", tokenizer, "unpruned")
    gates = unit_gates(model, ["ffn"])
    mask = gates.ones()
    mask["dec_ffn"][1, 10:] = 0.0
    prune_unit_mask(gates, mask)
    with pytest.raises(ConfigError, match="llama.cpp's gpt2 architecture, which holds one attention shape.*use export.format=onnx"):
        export_model("gguf", model, tokenizer, tmp_path / "out", {}, tokenizer_pre=PRE)
    assert not (tmp_path / "out").exists()


def test_gguf_check_mask_refuses_query_head_rows_of_gpt_families_before_work():
    from headprune.export.gguf_deci import check_mask

    for model_type in ("gpt2", "gpt_neox"):
        fields = {"model_type": model_type, "num_attention_heads": 4}
        check_mask(fields, {"dec_self": [[1, 1, 1, 1], [1, 1, 1, 1]]})  # every head kept: FFN or layer pruning
        with pytest.raises(ConfigError, match=r"prunes query heads in layers \[1\].*use export.format=onnx"):
            check_mask(fields, {"dec_self": [[1, 1, 1, 1], [1, 0, 1, 1]]})


@pytest.mark.parametrize(
    ("fields", "found"),
    [
        ({"model_type": "gpt2", "activation_function": "relu"}, "the activation relu, not GELU"),
        ({"model_type": "gpt2", "activation_function": "gelu_new", "scale_attn_by_inverse_layer_idx": True}, "inverse layer index"),
        ({"model_type": "gpt2", "activation_function": "gelu_new", "scale_attn_weights": False}, "unscaled attention"),
        ({"model_type": "gpt_neox", "hidden_act": "gelu", "attention_bias": False}, "no query_key_value or dense biases"),
        ({"model_type": "gpt_neox", "hidden_act": "gelu", "rope_parameters": {"rope_type": "linear", "factor": 2.0}}, "rotary scaling"),
    ],
)
def test_gguf_refuses_gpt_configs_llama_cpp_computes_otherwise(fields, found):
    from headprune.export.gguf import refusal

    why = refusal(fields)
    assert found in why and why.endswith("use export.format=onnx")


def test_gguf_takes_the_gpt_configs_llama_cpp_computes():
    from headprune.export.gguf import refusal

    assert refusal(tiny_family("gpt2").config.to_dict()) is None
    assert refusal(tiny_family("gpt_neox").config.to_dict()) is None  # exact GELU: llama.cpp's tanh GELU, within 5e-4
