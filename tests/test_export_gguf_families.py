"""GGUF rows of the Llama-like families (qwen2, qwen3, granite): the tensors and metadata read back with the gguf package,
the file's logits (numpy) against the pruned model's, and the layouts each row refuses before work."""

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


def _family_model(family: str):
    """tiny_llms' model of ``family``; gemma3_text with 6 layers, the one global layer in 6 llama.cpp's gemma3 takes."""
    if family != "gemma3_text":
        return tiny_family(family, attn="eager" if family == "gemma2" else "sdpa")
    from tiny_llms import DECODER_CONFIGS
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    fields = {**DECODER_CONFIGS["gemma3_text"], "num_hidden_layers": 6, "layer_types": None}
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model("gemma3_text", **fields)).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(0, 0.3)  # Gemma's norms scale by 1 + w: w away from 0
    return model


def _pruned(family: str, tokenizer, kv_removed: dict[int, list[int]], ffn_kept: int | None):
    """The tiny ``family`` model with KV groups {layer: [ids]} removed and every FFN cut to its first ``ffn_kept`` neurons."""
    from headprune.core.units import prune_unit_mask, unit_gates

    model = _family_model(family)
    model.resize_token_embeddings(len(tokenizer))
    gates = unit_gates(model, ["kv_group", "ffn"])
    mask = gates.ones()
    for layer, ids in kv_removed.items():
        mask["dec_self"][layer, ids] = 0.0
    if ffn_kept is not None:
        mask["dec_ffn"][:, ffn_kept:] = 0.0
    prune_unit_mask(gates, mask)
    gates.remove()
    return model


def _expected_tensors(model, heads: int, kv: int, width: int, extra) -> dict[str, list[int]]:
    """{GGUF tensor name: numpy shape} a uniformly pruned Llama-like file holds (head size 8, hidden 32), by hand;
    ``extra`` the family's own tensors, or "fused" (phi3: attn_qkv, ffn_up of gate | up)."""
    hidden, d, vocab = 32, getattr(model.config, "head_dim", None) or 8, model.config.vocab_size
    tensors = {"token_embd.weight": [vocab, hidden], "output_norm.weight": [hidden]}
    if not model.config.tie_word_embeddings:
        tensors["output.weight"] = [vocab, hidden]
    for i in range(model.config.num_hidden_layers):
        layer = {
            "attn_norm.weight": [hidden],
            "attn_q.weight": [heads * d, hidden],
            "attn_k.weight": [kv * d, hidden],
            "attn_v.weight": [kv * d, hidden],
            "attn_output.weight": [hidden, heads * d],
            "ffn_norm.weight": [hidden],
            "ffn_gate.weight": [width, hidden],
            "ffn_up.weight": [width, hidden],
            "ffn_down.weight": [hidden, width],
        }
        if extra == "fused":
            for name in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "ffn_gate.weight"):
                del layer[name]
            layer.update({"attn_qkv.weight": [(heads + 2 * kv) * d, hidden], "ffn_up.weight": [2 * width, hidden]})
        else:
            layer.update({name: shape(heads, kv, d) for name, shape in extra.items()})
        tensors.update({f"blk.{i}.{name}": shape for name, shape in layer.items()})
    return tensors


BIASES = {"attn_q.bias": lambda h, kv, d: [h * d], "attn_k.bias": lambda h, kv, d: [kv * d], "attn_v.bias": lambda h, kv, d: [kv * d]}
POST_NORMS = {"post_attention_norm.weight": lambda h, kv, d: [32], "post_ffw_norm.weight": lambda h, kv, d: [32]}
HEAD_NORMS = {"attn_q_norm.weight": lambda h, kv, d: [d], "attn_k_norm.weight": lambda h, kv, d: [d]}
CASES = {  # family, KV groups removed: (architecture written, heads, KV heads, FFN width, extra tensors)
    ("qwen2", "unpruned"): ("qwen2", 4, 2, 64, BIASES),
    ("qwen2", "uniform"): ("llama", 2, 1, 40, BIASES),  # llama.cpp's qwen2 reads square q/output: written as llama
    ("qwen3", "unpruned"): ("qwen3", 4, 2, 64, HEAD_NORMS),
    ("qwen3", "uniform"): ("qwen3", 2, 1, 40, HEAD_NORMS),
    ("granite", "uniform"): ("granite", 2, 1, 40, {}),
    ("phi3", "unpruned"): ("phi3", 4, 2, 64, "fused"),  # llama.cpp's phi3 reads the fused qkv and gate | up
    ("phi3", "uniform"): ("llama", 2, 1, 40, {}),  # llama.cpp's phi3 reads square q/output: split, written as llama
    ("gemma2", "uniform"): ("gemma2", 2, 1, 40, POST_NORMS),
    ("gemma3_text", "uniform"): ("gemma3", 2, 1, 40, {**POST_NORMS, **HEAD_NORMS}),
}


@pytest.mark.parametrize(("family", "case"), list(CASES), ids=[f"{f}-{c}" for f, c in CASES])
def test_gguf_row_tensors_metadata_and_logits_read_back(family, case, tmp_path):
    import gguf

    architecture, heads, kv, width, extra = CASES[family, case]
    tokenizer = _tokenizer()
    pruned = case == "uniform"
    layers = 6 if family == "gemma3_text" else 3
    model = _pruned(family, tokenizer, {layer: [1] for layer in range(layers)} if pruned else {}, 40 if pruned else None)
    exported = export_model("gguf", model, tokenizer, tmp_path, {}, tokenizer_pre=PRE)
    assert exported["architecture"] == architecture
    assert exported["job"]["reader"] == "gguf-numpy"  # transformers' reader derives these families' head size from the width
    reader = gguf.GGUFReader(str(exported["files"][0]))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == architecture
    assert (field(f"{architecture}.attention.head_count"), field(f"{architecture}.attention.head_count_kv")) == (heads, kv)
    assert field(f"{architecture}.feed_forward_length") == width
    assert field(f"{architecture}.attention.key_length") == (getattr(model.config, "head_dim", None) or 8)
    written = {t.name: [int(n) for n in t.data.shape] for t in reader.tensors}
    assert written == _expected_tensors(model, heads, kv, width, extra)
    known = {gguf.TENSOR_NAMES[t] for t in gguf.MODEL_TENSORS[gguf.MODEL_ARCH[architecture.upper()]]}
    assert {name.rsplit(".", 1)[0].replace(f"blk.{name.split('.')[1]}.", "blk.{bid}.") for name in written} <= known
    if family == "granite":
        assert field("granite.logit_scale") == pytest.approx(model.config.logits_scaling)
        assert field("granite.attention.scale") == pytest.approx(model.config.attention_multiplier)
    ids = torch.tensor([tokenizer(text)["input_ids"] for text in TEXTS[:2]])
    with torch.no_grad():
        reference = model(input_ids=ids).logits.numpy()
    got = GGUFDecoder(str(exported["files"][0])).logits(ids.numpy())
    assert np.abs(got - reference).max() <= 1e-4 * max(1.0, float(np.abs(reference).max()))


def test_gguf_refuses_an_uneven_layout_of_a_row_without_deci(tmp_path):
    tokenizer = _tokenizer()
    model = _pruned("qwen3", tokenizer, {0: [1]}, None)  # layer 0 keeps one KV group, the others two
    with pytest.raises(ConfigError, match="llama.cpp's qwen3 architecture, which holds one attention shape.*use export.format=onnx"):
        export_model("gguf", model, tokenizer, tmp_path / "out", {}, tokenizer_pre=PRE)
    assert not (tmp_path / "out").exists()


def test_gguf_refuses_uneven_ffn_widths_of_a_row_without_deci(tmp_path):
    from headprune.core.units import prune_unit_mask, unit_gates

    tokenizer = _tokenizer()
    model = tiny_family("granite")
    model.resize_token_embeddings(len(tokenizer))
    gates = unit_gates(model, ["ffn"])
    mask = gates.ones()
    mask["dec_ffn"][1, 10:] = 0.0
    prune_unit_mask(gates, mask)
    with pytest.raises(ConfigError, match="granite architecture, which holds one attention shape and one FFN width"):
        export_model("gguf", model, tokenizer, tmp_path / "out", {}, tokenizer_pre=PRE)


def test_gguf_check_mask_refuses_uneven_rows_before_work():
    from headprune.export.gguf_deci import check_mask

    fields = {"model_type": "qwen3", "num_attention_heads": 4, "num_key_value_heads": 2}
    check_mask(fields, {"dec_self": [[1, 1, 0, 0], [1, 1, 0, 0]]})  # one KV group in each layer: uniform
    with pytest.raises(ConfigError, match="export.format=onnx"):
        check_mask(fields, {"dec_self": [[1, 1, 0, 0], [1, 1, 1, 1]]})
    check_mask({**fields, "model_type": "llama"}, {"dec_self": [[1, 1, 0, 0], [1, 1, 1, 1]]})  # llama: deci takes it


def test_gguf_refuses_a_qwen2_sliding_window_and_unmapped_families():
    from headprune.export.gguf import refusal

    assert "no sliding window" in refusal({"model_type": "qwen2", "use_sliding_window": True})
    assert "phi3 without a sliding window" in refusal({"model_type": "phi3", "sliding_window": 2047})
    assert "partial_rotary_factor 1" in refusal({"model_type": "phi3", "rope_parameters": {"partial_rotary_factor": 0.75}})
    assert refusal({"model_type": "qwen3", "attention_bias": True}).startswith("export.format=gguf writes Llama models without")
    assert refusal({"model_type": "granite"}) is None
    gemma3 = tiny_family("gemma3_text").config.to_dict()  # layers sliding, global, sliding
    assert "layer_types" in refusal(gemma3) and "every 6 layers one global" in refusal(gemma3)
    gemma2 = tiny_family("gemma2", attn="eager").config.to_dict()
    assert refusal(gemma2) is None
    assert "query_pre_attn_scalar 32" in refusal({**gemma2, "query_pre_attn_scalar": 32})
    assert "output projection apart" in refusal({**gemma2, "tie_word_embeddings": False})


def test_a_phi3_name_is_written_so_llama_cpp_loads_a_tokenizer_without_its_end_token():
    from headprune.export.gguf import safe_name

    tokenizer = _tokenizer()
    assert safe_name("tiny_phi3-pruned", tokenizer) == "tiny_Phi 3-pruned" and safe_name("PHI-3 mini", tokenizer) == "Phi 3 mini"
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    assert safe_name("tiny_phi3-pruned", tokenizer) == "tiny_phi3-pruned"  # the token llama.cpp looks up is there


def test_the_check_of_a_sliding_window_file_leaves_padding_positions_out(tmp_path):
    """Right padding longer than Gemma 3's window of 4 leaves padded queries no key: sdpa and eager (and the numpy reader)
    differ there, so the causal check compares the real positions only, and passes."""
    from headprune.export.verify import check_export, reference_logits

    tokenizer = _tokenizer()
    model = _pruned("gemma3_text", tokenizer, {layer: [1] for layer in range(6)}, 40)
    exported = export_model("gguf", model, tokenizer, tmp_path, {}, tokenizer_pre=PRE)
    encoded = tokenizer(["the cat", TEXTS[0] + " " + TEXTS[1]], return_tensors="pt", padding=True)
    batches = [{"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}]
    assert int(encoded["attention_mask"][0].sum()) + 4 < encoded["input_ids"].shape[1]  # a padded query beyond the window
    report = check_export({**exported["job"], "causal": True}, batches, reference_logits(model, batches))
    assert report["passed"], report
