"""vLLM's DeciLMForCausalLM export (export.format=deci_hf): config.json holds what vLLM's nemotron_nas reads, the weights
have the names and shapes its loader expects, and a forward written from the block_configs reproduces the masked
headprune model, for a tiny Llama with uneven KV groups (query heads pruned inside them), uneven FFN widths, one no-op FFN
and one no-op attention."""

import copy
import json

import pytest
import torch
from tiny_llms import lm_batch, tiny_llama

from headprune.core.checks import ConfigError
from headprune.core.inputs import model_inputs
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.export.deci_hf import check_mask, export_deci_hf
from headprune.export.decilm_reference import DeciLMReference, load_config

# What vLLM reads of a DeciLM config (vllm/model_executor/models/nemotron_nas.py, its LlamaAttention and LlamaMLP, and
# NemotronNasModelArchConfigConvertor): the model-wide fields that config.json must hold, and each block's entries.
VLLM_FIELDS = {
    "architectures",  # DeciLMForCausalLM picks nemotron_nas.py
    "model_type",  # nemotron-nas
    "auto_map",  # the config class transformers builds with trust_remote_code
    "hidden_size",
    "num_attention_heads",  # the query heads of every layer with attention
    "num_hidden_layers",
    "head_dim",
    "rms_norm_eps",
    "vocab_size",
    "hidden_act",  # the FFN activation unless an ffn entry has its own hidden_act
    "max_position_embeddings",
    "rope_parameters",  # DeciLMAttention._init_rotary_emb
    "tie_word_embeddings",  # lm_head tied to the embeddings, and not loaded
    "attention_bias",
    "mlp_bias",
    "block_configs",
}
BLOCK_ENTRIES = {  # the per-layer entries: vLLM reads no_op, n_heads_in_group and (without ffn_mult) intermediate_size
    "attention": {"no_op", "replace_with_linear", "n_heads_in_group"},
    "ffn": {"no_op", "replace_with_linear", "intermediate_size"},
}
WIDTHS = [40, 0, 17, 64]  # FFN neurons kept per layer: layer 1's FFN is a no-op
HEADS = [[1, 0, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]]  # query heads kept (2 per KV head): layer 2 has no attention


def _mask(gates, heads=HEADS, widths=WIDTHS):
    gen = torch.Generator().manual_seed(0)
    ffn = torch.zeros(len(widths), gates.groups["dec_ffn"][1])
    for layer, width in enumerate(widths):
        ffn[layer, torch.randperm(ffn.shape[1], generator=gen)[:width]] = 1.0
    return {"dec_self": torch.tensor(heads, dtype=torch.float32), "dec_ffn": ffn}


def _export(tmp_path, heads=HEADS, widths=WIDTHS):
    """(the unpruned model, its joint gates, the mask, what export_deci_hf wrote) for a 4-layer tiny Llama."""
    model = tiny_llama(layers=4)
    gates = unit_gates(model, "head+ffn")
    mask = _mask(gates, heads, widths)
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "head+ffn"), mask)
    unit_gates(pruned, "head").remove()  # the model's own attention, as the export experiment writes it
    return model, gates, mask, export_deci_hf(pruned, None, tmp_path / "deci")


def _logit_gap(model, gates, mask, folder) -> tuple[float, float]:
    """(max |reference forward - masked model| over two padded batches, the logits' scale)."""
    reference = DeciLMReference(str(folder))
    gaps, scales = [], []
    for batch in (lm_batch(), lm_batch(seed=1, batch=2, length=7)):
        with torch.no_grad(), gates.masked(mask):
            masked = model(**model_inputs(model, batch)).logits
        out = torch.from_numpy(reference.logits(batch["input_ids"].numpy(), batch["attention_mask"].numpy()))
        gaps.append(float((out - masked).abs().max()))
        scales.append(float(masked.abs().max()))
    return max(gaps), max(scales)


def test_the_torch_forward_of_the_block_configs_is_the_masked_model(tmp_path):
    model, gates, mask, written = _export(tmp_path)
    gap, scale = _logit_gap(model, gates, mask, tmp_path / "deci")
    assert gap <= 1e-5 * max(1.0, scale)
    assert written["layout"] == [
        {"heads": 4, "kv_heads": 2, "ffn": 40},  # KV head 0 keeps 1 of its 2 query heads: one zero head
        {"heads": 4, "kv_heads": 1, "ffn": 0},  # one KV head: n_heads_in_group 4, two zero heads
        {"heads": 0, "kv_heads": 0, "ffn": 17},  # no attention
        {"heads": 4, "kv_heads": 2, "ffn": 64},
    ]
    assert written["padded_query_heads"] == [1, 2, 0, 2] and written["placeholder_layers"] == []
    assert sorted(p.name for p in (tmp_path / "deci").iterdir()) == [  # reading it left nothing behind (no __pycache__)
        "config.json",
        "configuration_decilm.py",
        "generation_config.json",
        "model.safetensors",
    ]


def test_config_holds_what_vllm_reads_and_the_config_class_reads_it_as_vllm_does(tmp_path):
    _, _, _, written = _export(tmp_path)
    fields = json.loads((tmp_path / "deci" / "config.json").read_text())
    assert VLLM_FIELDS <= set(fields) and fields["architectures"] == ["DeciLMForCausalLM"] and fields["model_type"] == "nemotron-nas"
    assert all({part: set(block[part]) for part in block} == BLOCK_ENTRIES for block in fields["block_configs"])
    config = load_config(str(tmp_path / "deci"))  # the shipped configuration_decilm.py, as trust_remote_code loads it
    for block, shape in zip(config.block_configs, written["layout"]):
        assert not hasattr(block.ffn, "ffn_mult")  # vLLM takes intermediate_size as it is (ffn_mult rounds to 256)
        assert block.attention.no_op == (shape["kv_heads"] == 0) and block.ffn.no_op == (shape["ffn"] == 0)
        if not block.attention.no_op:  # vLLM: num_kv_heads = num_attention_heads // n_heads_in_group
            assert config.num_attention_heads // block.attention.n_heads_in_group == shape["kv_heads"]
        if not block.ffn.no_op:
            assert block.ffn.intermediate_size == shape["ffn"]


def test_autoconfig_with_remote_code_builds_the_shipped_class(tmp_path, monkeypatch):
    """What vLLM calls: AutoConfig.from_pretrained(dir, trust_remote_code=True) (its modules cache kept in tmp_path)."""
    from transformers import AutoConfig, dynamic_module_utils

    monkeypatch.setattr(dynamic_module_utils, "HF_MODULES_CACHE", str(tmp_path / "modules"))
    _export(tmp_path)
    config = AutoConfig.from_pretrained(str(tmp_path / "deci"), trust_remote_code=True)
    assert type(config).__name__ == "DeciLMConfig" and config.block_configs[2].attention.no_op
    assert config.block_configs[1].attention.n_heads_in_group == 4 and config.block_configs[0].ffn.intermediate_size == 40


def test_weights_have_the_names_and_shapes_vllm_builds_from_the_config(tmp_path):
    """The parameters DeciLMDecoderLayer creates from each block (before its loader stacks q/k/v and gate/up), by HF name."""
    from safetensors.torch import load_file

    _export(tmp_path)
    fields = json.loads((tmp_path / "deci" / "config.json").read_text())
    hidden, heads, d, vocab = fields["hidden_size"], fields["num_attention_heads"], fields["head_dim"], fields["vocab_size"]
    expected = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    if not fields["tie_word_embeddings"]:
        expected["lm_head.weight"] = [vocab, hidden]
    for layer, block in enumerate(fields["block_configs"]):
        prefix = f"model.layers.{layer}."
        if not block["attention"]["no_op"]:
            kv = heads // block["attention"]["n_heads_in_group"]
            expected.update(
                {
                    prefix + "input_layernorm.weight": [hidden],
                    prefix + "self_attn.q_proj.weight": [heads * d, hidden],
                    prefix + "self_attn.k_proj.weight": [kv * d, hidden],
                    prefix + "self_attn.v_proj.weight": [kv * d, hidden],
                    prefix + "self_attn.o_proj.weight": [hidden, heads * d],
                }
            )
        if not block["ffn"]["no_op"]:
            width = block["ffn"]["intermediate_size"]
            expected.update(
                {
                    prefix + "post_attention_layernorm.weight": [hidden],
                    prefix + "mlp.gate_proj.weight": [width, hidden],
                    prefix + "mlp.up_proj.weight": [width, hidden],
                    prefix + "mlp.down_proj.weight": [hidden, width],
                }
            )
    tensors = load_file(str(tmp_path / "deci" / "model.safetensors"))
    assert {name: list(t.shape) for name, t in tensors.items()} == expected


def test_an_ffn_before_any_attention_gets_a_zero_attention(tmp_path):
    """vLLM's residual stream starts at its first attention: layer 0 without heads but with neurons keeps a zero attention
    over one KV head, and the forward is still the masked model's."""
    heads = [[0, 0, 0, 0], [1, 1, 1, 1], [0, 1, 0, 0], [1, 1, 1, 1]]
    model, gates, mask, written = _export(tmp_path, heads=heads)
    assert written["placeholder_layers"] == [0] and written["layout"][0] == {"heads": 4, "kv_heads": 1, "ffn": 40}
    gap, scale = _logit_gap(model, gates, mask, tmp_path / "deci")
    assert gap <= 1e-5 * max(1.0, scale)


def test_a_kv_count_that_does_not_divide_the_query_heads_is_refused():
    fields = {"num_attention_heads": 9, "num_key_value_heads": 3}
    check_mask(fields, {"dec_self": [[1] * 9, [0, 0, 0, 1, 1, 1, 0, 0, 0]]})  # 3 and 1 KV heads: 9 / 3, 9 / 1
    with pytest.raises(ConfigError, match=r"layer 1 keeps 2 KV heads.*one of \[1, 3, 9\] KV heads"):
        check_mask(fields, {"dec_self": [[1] * 9, [1, 0, 0, 0, 0, 0, 0, 1, 1]]})


@pytest.mark.parametrize(
    "extra,words",
    [
        ({"rope_scaling": {"rope_type": "yarn"}}, "default or linear rotary embeddings only"),
        ({"mlp_bias": True}, "without attention or MLP biases"),
    ],
)
def test_gguf_and_deci_hf_refuse_the_same_llama_layouts(extra, words):
    """The two Llama-layout writers refuse the same rotary embeddings and biases, each naming what works instead."""
    from headprune.export.deci_hf import refusal as deci_refusal
    from headprune.export.gguf import refusal as gguf_refusal

    fields = {"model_type": "llama", **extra}
    assert words in gguf_refusal(fields) and gguf_refusal(fields).endswith("use export.format=hf or onnx")
    assert words in deci_refusal(fields) and deci_refusal(fields).endswith("use export.format=onnx")
