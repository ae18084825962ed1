"""Exports of pruned models: each format and family it takes reproduces the masked model in a fresh interpreter without headprune."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import classifier_batch, seq2seq_batch, tiny_bart, tiny_bert, tiny_marian, tiny_roberta
from tiny_llms import lm_batch, tiny_decoder, tiny_family, tiny_llama, tiny_qwen2

from headprune.core.attention.gates import HeadGates
from headprune.core.checks import ConfigError
from headprune.core.pruning import prune_heads, prune_kv_groups
from headprune.export import export_model
from headprune.export.verify import check_export, check_exports, eos_and_pad, greedy_tokens, reference_logits

TRAINED_PRE = "gpt-2"  # a tokenizer trained here has no name llama.cpp knows: the tests name its byte-level splitting


def inputs(batch: dict) -> dict:
    return {k: v for k, v in batch.items() if k != "labels"}


def masked_reference(model, removed: dict, batches: list[dict], prompt=None, new_tokens: int = 6):
    """Logits (and greedy tokens) of ``model`` with the heads ``removed`` ({group: {layer: [ids]}}) gated to zero."""
    gates = HeadGates(model)
    mask = gates.ones()
    for group, layers in removed.items():
        for layer, heads in layers.items():
            mask[group][layer, heads] = 0.0
    with gates.masked(mask):
        logits = reference_logits(model, batches)
        tokens = None if prompt is None else greedy_tokens(model, prompt, new_tokens)
    gates.remove()
    return logits, tokens


def prepared(fmt, model, removed, batches, tmp_path, tokenizer=None, generate=False, **options) -> tuple:
    """Prune a copy by ``removed`` and export it: (job, batches, masked reference, greedy) for ``check_exports``."""
    prompt = batches[0]["input_ids"][:2, :4] if generate else None
    reference, tokens = masked_reference(model, removed, batches, prompt)
    pruned = copy.deepcopy(model)
    prune_heads(pruned, removed)
    HeadGates(pruned).remove()
    exported = export_model(fmt, pruned, tokenizer, tmp_path, batches[0], **options)
    greedy = None if prompt is None else (prompt, tokens, *eos_and_pad(model), 6)
    return exported["job"], batches, reference, greedy


def checked(items: list[tuple]) -> list[dict]:
    """Reports of the exports, all checked in one fresh interpreter (which cannot import headprune)."""
    reports = check_exports(items)
    assert all(r["headprune_importable"] is False for r in reports)
    return reports


def export_and_check(fmt, model, removed, batches, tmp_path, tokenizer=None, generate=False, **options) -> dict:
    """Prune a copy by ``removed``, export it and check it against the masked original; the checker's report."""
    return checked([prepared(fmt, model, removed, batches, tmp_path, tokenizer, generate, **options)])[0]


UNEVEN = {"enc_self": {0: [1, 2], 2: [0]}}


def test_onnx_encoders_and_encoder_decoders_with_uneven_heads(tmp_path):
    items = []
    for name, make in (("bert", tiny_bert), ("roberta", tiny_roberta)):
        batches = [inputs(classifier_batch(seed=s, batch=3 + s, length=7 + 2 * s, vocab=90)) for s in range(2)]  # other shapes than traced
        items.append(prepared("onnx", make(), {"enc_self": {0: [1, 2], 1: [0]}}, batches, tmp_path / name))
    for name, make in (("marian", tiny_marian), ("bart", tiny_bart)):
        batches = []
        for s in range(2):
            batch = seq2seq_batch(seed=s, batch=3 + s, src_len=7 + s, tgt_len=5 + 2 * s)
            batches.append(
                {
                    "input_ids": batch["input_ids"],
                    "attention_mask": batch["attention_mask"],
                    "decoder_input_ids": batch["labels"].clamp(min=2),
                }
            )
        removed = {"enc_self": {0: [1, 2]}, "enc_dec": {1: [0, 1, 2]}, "dec_self": {0: [3]}}
        items.append(prepared("onnx", make(), removed, batches, tmp_path / name))
    for report in checked(items):
        assert report["passed"] and report["max_abs_diff"] <= 1e-5


def test_onnx_of_distilbert_deberta_v2_and_t5_with_an_emptied_layer(tmp_path):
    from tiny_encoders import VOCAB, tiny_deberta_v2, tiny_distilbert, tiny_t5

    items = []
    for name, make in (("distilbert", tiny_distilbert), ("deberta-v2", tiny_deberta_v2)):
        batches = [inputs(classifier_batch(seed=s, batch=3 + s, length=7 + 2 * s, vocab=VOCAB)) for s in range(2)]
        items.append(prepared("onnx", make(), {"enc_self": {0: [1, 2], 1: [0, 1, 2, 3]}}, batches, tmp_path / name))
    batches = []
    for s in range(2):
        batch = seq2seq_batch(seed=s, batch=3 + s, src_len=7 + s, tgt_len=5 + 2 * s, vocab=VOCAB)
        batches.append(
            {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "decoder_input_ids": batch["labels"].clamp(min=2)}
        )
    removed = {"enc_self": {0: [1, 2]}, "enc_dec": {1: [0, 1, 2, 3]}, "dec_self": {0: [3], 2: [1]}}  # T5: position bias cut per layer
    items.append(prepared("onnx", tiny_t5(), removed, batches, tmp_path / "t5"))
    for report in checked(items):
        assert report["passed"] and report["max_abs_diff"] <= 1e-5


def test_onnx_of_whisper_takes_speech_features(tmp_path):
    """Whisper: encoder.onnx reads input_features (float), decoder.onnx no source mask; other batch sizes than traced."""
    from tiny_encoders import speech_batch, tiny_whisper

    batches = [inputs(speech_batch(seed=s, batch=3 + s)) for s in range(2)]
    removed = {"enc_self": {0: [1, 2], 1: [0, 1, 2, 3]}, "enc_dec": {1: [0]}, "dec_self": {0: [3]}}  # uneven, an emptied layer
    import onnx

    job, *rest = prepared("onnx", tiny_whisper(), removed, batches, tmp_path / "whisper")
    graph_inputs = {name: [i.name for i in onnx.load(path).graph.input] for name, path in job["files"].items()}
    assert graph_inputs == {"encoder": ["input_features"], "decoder": ["decoder_input_ids", "encoder_hidden_states"]}
    report = checked([(job, *rest)])[0]
    assert report["passed"] and report["max_abs_diff"] <= 1e-5 * max(1.0, report["reference_max_abs"])


LLAMA_FAMILY = {
    "llama": lambda: tiny_llama(),
    "mistral": lambda: tiny_decoder("mistral"),
    "qwen2": lambda: tiny_qwen2(),
    "qwen3": lambda: tiny_decoder("qwen3"),
}


def test_onnx_decoders_with_uneven_query_heads_and_greedy_tokens(tmp_path):
    items = []
    for family, make in sorted(LLAMA_FAMILY.items()):
        removed = {"dec_self": {0: [1], 1: [0, 2]}}  # uneven query heads per KV head: the graph keeps headprune's KV map
        batches = [inputs(lm_batch(seed=s, batch=2 + s, length=6 + 3 * s)) for s in range(2)]
        items.append(prepared("onnx", make(), removed, batches, tmp_path / family, generate=True))
    for report in checked(items):
        assert report["passed"] and report["greedy_equal"]


@pytest.mark.slow
def test_onnx_of_other_decoder_families_with_an_emptied_layer(tmp_path):
    from tiny_llms import tiny_family

    items = []
    for model_type in ("gpt2", "gpt_neox", "opt", "phi3", "gemma2", "gemma3_text", "granite", "falcon"):
        removed = {"dec_self": {0: [1], 1: [0, 1, 2, 3], 2: [0, 2, 3]}}  # uneven, emptied (a phantom head), uneven
        batches = [inputs(lm_batch(seed=s, batch=2 + s, length=6 + 3 * s)) for s in range(2)]
        model = tiny_family(model_type, attn="eager" if model_type == "gemma2" else "sdpa")
        items.append(prepared("onnx", model, removed, batches, tmp_path / model_type, generate=True))
    for report in checked(items):
        assert report["passed"] and report["greedy_equal"]


@pytest.mark.slow
def test_stock_hf_checkpoints_of_other_grouped_query_decoders(tmp_path):
    from tiny_llms import tiny_family

    items, models = [], {}
    for model_type in ("granite", "gemma2", "gemma3_text", "phi3"):
        model = models[model_type] = tiny_family(model_type, attn="eager" if model_type == "gemma2" else "sdpa")
        removed = kv_removed(model, [[layer % 2] for layer in range(model.config.num_hidden_layers)])  # one KV group of two per layer
        batches = [inputs(lm_batch(seed=s, batch=2 + s, length=6 + 3 * s)) for s in range(2)]
        items.append(prepared("hf", model, removed, batches, tmp_path / model_type, generate=True))
    for (model_type, model), report in zip(models.items(), checked(items)):
        assert report["passed"] and report["greedy_equal"] and report["architecture"] == type(model).__name__, model_type


def kv_removed(model, per_layer: list[list[int]]) -> dict:
    """The query heads of the KV groups ``per_layer`` ({layer: [KV ids]}) as {group: {layer: [head ids]}}."""
    n = model.config.num_attention_heads // model.config.num_key_value_heads
    return {"dec_self": {layer: [h for k in kv for h in range(k * n, (k + 1) * n)] for layer, kv in enumerate(per_layer)}}


def test_stock_hf_checkpoints_of_the_llama_family(tmp_path):
    import json

    items, models = [], {}
    for family, make in sorted(LLAMA_FAMILY.items()):
        model = models[family] = make()
        removed = kv_removed(model, [[layer % 2] for layer in range(model.config.num_hidden_layers)])  # one KV group of two per layer
        batches = [inputs(lm_batch(seed=s, batch=2 + s, length=6 + 3 * s)) for s in range(2)]
        items.append(prepared("hf", model, removed, batches, tmp_path / family, generate=True))
    for (family, model), report in zip(sorted(models.items()), checked(items)):
        assert report["passed"] and report["greedy_equal"] and report["architecture"] == type(model).__name__
        config = json.loads((tmp_path / family / "config.json").read_text())
        assert config["num_key_value_heads"] == 1 and config["head_dim"] == 8
        assert config["num_attention_heads"] == model.config.num_attention_heads // 2
        assert "headprune_pruned_heads" not in config


def test_a_llama_whose_hidden_size_no_longer_divides_by_its_heads_is_written_as_mistral(tmp_path):
    """LlamaConfig refuses hidden 32 over 7 heads; a bias-free Llama computes the same function as that Mistral."""
    from transformers import LlamaConfig

    from headprune.export.hf import stock_model

    with pytest.raises(Exception, match="multiple"):  # huggingface_hub's StrictDataclassClassValidationError
        LlamaConfig(hidden_size=32, num_attention_heads=7, num_key_value_heads=7, head_dim=4)
    model = tiny_llama(heads=8, kv_heads=8)
    removed = {"dec_self": {layer: [(3 * layer) % 8] for layer in range(3)}}  # one head of eight in every layer
    pruned = copy.deepcopy(model)
    prune_heads(pruned, removed)
    HeadGates(pruned).remove()
    stock = stock_model(pruned)
    assert type(stock).__name__ == "MistralForCausalLM" and stock.config.sliding_window is None
    for seed in range(3):
        batch = inputs(lm_batch(seed=seed, batch=3, length=12, left_pad=seed == 2))
        with torch.no_grad():
            mine, theirs = pruned(**batch).logits, stock(**batch).logits
        real = batch["attention_mask"].bool()
        assert torch.allclose(mine[real], theirs[real], rtol=0, atol=1e-6 * float(mine.abs().max()))
    prompt = lm_batch(seed=5, batch=2, length=5)["input_ids"]
    assert (greedy_tokens(pruned, prompt, 8) == greedy_tokens(stock, prompt, 8)).all()
    batches = [inputs(lm_batch(seed=s, batch=2, length=7)) for s in range(2)]
    report = export_and_check("hf", model, removed, batches, tmp_path, generate=True)
    assert report["passed"] and report["architecture"] == "MistralForCausalLM"


def test_a_smollm2_like_llama_export_loads_alone_and_generates_as_headprune_pruned_model(tmp_path):
    """9 query heads over 3 KV heads; one KV group removed in every layer: a stock LlamaForCausalLM of 6 heads over 2."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=72,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=8,
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(config).eval()
    gates = HeadGates(model)
    pruned = copy.deepcopy(model)
    prune_kv_groups(pruned, {"dec_self": {0: [2], 1: [0], 2: [1]}})
    HeadGates(pruned).remove()
    assert {(len(s.head_ids), len(s.kv_ids)) for s in HeadGates(pruned).sites} == {(6, 2)}
    gates.remove()
    batches = [inputs(lm_batch(seed=s, batch=3, length=10)) for s in range(2)]
    prompt = batches[0]["input_ids"][:3, :5]
    reference = reference_logits(pruned, batches)  # headprune's pruned model itself
    tokens = greedy_tokens(pruned, prompt, 12)
    exported = export_model("hf", pruned, None, tmp_path, batches[0])
    report = check_export(exported["job"], batches, reference, (prompt, tokens, *eos_and_pad(pruned), 12))
    assert report["passed"] and report["greedy_equal"] and report["architecture"] == "LlamaForCausalLM"
    assert report["headprune_importable"] is False


def test_gguf_of_uniformly_pruned_llama_and_mistral_in_f32_and_f16(tmp_path):
    from headprune.export.gguf import rounded_like_gguf
    from headprune.export.verify import sample_texts
    from headprune.models.tokenizers import train_tokenizer

    texts = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
    tokenizer = train_tokenizer(texts * 5, vocab_size=300)
    encoded = tokenizer(texts[:4], return_tensors="pt", padding=True)
    batches = [{"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}]
    prompt = encoded["input_ids"][:2, :3]
    items, f16_gap = [], {}
    for family in ("llama", "mistral"):
        torch.manual_seed(0)
        model = tiny_llama(layers=2) if family == "llama" else tiny_decoder("mistral")
        model.resize_token_embeddings(len(tokenizer))
        for config in (model.config, model.generation_config):
            config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        pruned = copy.deepcopy(model)
        prune_heads(pruned, kv_removed(model, [[1], [0]]))
        HeadGates(pruned).remove()
        for dtype in ("f32", "f16"):
            source = rounded_like_gguf(pruned, dtype)  # f16: the reference holds the matrices as the file does
            reference, tokens = reference_logits(source, batches), greedy_tokens(source, prompt, 6)
            if dtype == "f16":
                f16_gap[family] = float(abs(reference_logits(pruned, batches)[0] - reference[0]).max())
            exported = export_model(
                "gguf", pruned, tokenizer, tmp_path / f"{family}-{dtype}", batches[0], gguf_dtype=dtype, tokenizer_pre=TRAINED_PRE
            )
            job = {**exported["job"], **sample_texts(tokenizer, batches)}
            items.append((job, batches, reference, (prompt, tokens, *eos_and_pad(pruned), 6)))
    for report in checked(items):
        assert report["passed"] and report["greedy_equal"] and report["tokenizer_equal"]
    assert min(f16_gap.values()) > 1e-6  # the f16 files are not the f32 models: checked against their own rounded weights


def test_gguf_keeps_llama_cpp_names_permutation_and_metadata(tmp_path):
    import gguf
    import numpy as np

    from headprune.export.gguf import permute_rotary
    from headprune.models.tokenizers import train_tokenizer

    tokenizer = train_tokenizer(["a b c d e f g abc abd bcd"] * 20, vocab_size=270)
    model = tiny_llama(layers=2)
    model.resize_token_embeddings(len(tokenizer))
    prune_kv_groups(model, {"dec_self": {0: [0], 1: [1]}})
    HeadGates(model).remove()
    path = export_model("gguf", model, tokenizer, tmp_path, {}, gguf_dtype="f16", tokenizer_pre=TRAINED_PRE)["files"][0]
    reader = gguf.GGUFReader(str(path))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == "llama"
    assert (field("llama.attention.head_count"), field("llama.attention.head_count_kv"), field("llama.rope.dimension_count")) == (2, 1, 8)
    assert field("llama.attention.key_length") == 8 and field("tokenizer.ggml.model") == "gpt2"
    tensors = {t.name: t for t in reader.tensors}
    assert ("output.weight" in tensors) == (not model.config.tie_word_embeddings)  # tied: llama.cpp reads token_embd
    assert tensors["blk.0.attn_norm.weight"].tensor_type == gguf.GGMLQuantizationType.F32
    assert tensors["blk.0.attn_q.weight"].tensor_type == gguf.GGMLQuantizationType.F16
    q = model.model.layers[0].self_attn.q_proj.weight.detach()
    stored = np.asarray(tensors["blk.0.attn_q.weight"].data, dtype=np.float32).reshape(q.shape)
    assert np.allclose(stored, permute_rotary(q, 2).half().float().numpy())


def test_refusals_name_what_works(tmp_path):
    bert = tiny_bert()
    with pytest.raises(ConfigError, match="export.format=onnx"):
        export_model("hf", bert, None, tmp_path / "bert", {})
    llama = tiny_llama()
    prune_heads(llama, {"dec_self": {0: [1]}})  # layer 0 uneven, the others whole
    with pytest.raises(ConfigError, match="prune.layout=uniform"):
        export_model("hf", llama, None, tmp_path / "uneven", {})
    with pytest.raises(ConfigError, match="not 'opt'.*use export.format=onnx"):
        export_model("gguf", tiny_family("opt"), None, tmp_path / "opt", {})
    assert not (tmp_path / "bert").exists() and not (tmp_path / "uneven").exists()


def test_gguf_of_the_one_ffn_width_left_after_a_layer_goes_says_that_width(tmp_path):
    """Layers kept 40 and 30 neurons, then the second layer went: the llama file's feed_forward_length is the 40 its tensors hold."""
    import gguf

    from headprune.core.units import prune_unit_mask, unit_gates
    from headprune.models.tokenizers import train_tokenizer

    tokenizer = train_tokenizer(["a b c d e f g abc abd bcd"] * 20, vocab_size=270)
    model = tiny_llama(layers=2)
    model.resize_token_embeddings(len(tokenizer))
    gates = unit_gates(model, ["ffn", "layer"])
    mask = {group: torch.ones(shape) for group, shape in gates.groups.items()}
    mask["dec_ffn"][0, :24], mask["dec_ffn"][1, :34], mask["dec_layer"][1] = 0, 0, 0
    prune_unit_mask(gates, mask)
    path = export_model("gguf", model, tokenizer, tmp_path, {}, tokenizer_pre=TRAINED_PRE)["files"][0]
    reader = gguf.GGUFReader(str(path))
    assert reader.fields["general.architecture"].contents() == "llama" and reader.fields["llama.block_count"].contents() == 1
    assert reader.fields["llama.feed_forward_length"].contents() == model.model.layers[0].mlp.down_proj.in_features == 40
