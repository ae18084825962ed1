"""The ONNX export directory is self-contained: a fresh interpreter with onnxruntime and tokenizers, but no torch,
transformers or headprune, gives the masked model's predictions from raw text."""

from __future__ import annotations

import copy
import json

import pytest
from conftest import tiny_bert
from tiny_llms import tiny_llama

from headprune.core.attention.gates import HeadGates
from headprune.core.pruning import prune_heads
from headprune.export import export_model
from headprune.export.onnx_dir_check import compare_predictions, masked_predictions, run_client

NLI_LABELS = ("entailment", "neutral", "contradiction")
PAIRS = [
    ["A man is eating pizza in the park.", "Someone eats."],
    ["Two dogs run on the beach.", "The animals are asleep indoors."],
    ["A woman reads.", "A woman reads a long novel about the sea at night."],
]
PROMPTS = ["the cat sat on the", "a dog near home", "the bird"]


@pytest.fixture(scope="module")
def minilm_tokenizer():
    from transformers import AutoTokenizer

    from headprune.models.sources import resolve_pretrained

    return AutoTokenizer.from_pretrained(resolve_pretrained("minilm"))


def masked_and_pruned(model, removed: dict):
    """(gates on ``model`` with the mask of ``removed`` {group: {layer: [ids]}}, the mask, a physically pruned copy)."""
    gates = HeadGates(model)
    mask = gates.ones()
    for group, layers in removed.items():
        for layer, heads in layers.items():
            mask[group][layer, heads] = 0.0
    pruned = copy.deepcopy(model)
    gates.remove()
    prune_heads(pruned, removed)
    HeadGates(pruned).remove()
    return HeadGates(model), mask, pruned


def exported(model, tokenizer, removed: dict, example_texts, out):
    """Export the pruned copy into ``out``; (gates, mask, description)."""
    gates, mask, pruned = masked_and_pruned(model, removed)
    example = dict(tokenizer(*example_texts, padding=True, return_tensors="pt"))
    export_model("onnx", pruned, tokenizer, out, example)
    return gates, mask, json.loads((out / "headprune_export.json").read_text())


def test_a_pruned_classifier_directory_classifies_raw_text_without_torch(minilm_tokenizer, tmp_path):
    from transformers import AutoConfig

    from headprune.export.onnx import quantize_int8

    model = tiny_bert()
    model.resize_token_embeddings(len(minilm_tokenizer))
    model.config.id2label = dict(enumerate(NLI_LABELS))
    model.config.label2id = {name: i for i, name in enumerate(NLI_LABELS)}
    removed = {"enc_self": {0: [1, 2], 2: [0]}}  # uneven: 2, 4 and 3 heads
    out = tmp_path / "onnx"
    gates, mask, description = exported(model, minilm_tokenizer, removed, (["a b c"], ["d e"]), out)
    assert {"model.onnx", "config.json", "tokenizer.json", "tokenizer_config.json", "headprune_export.json"} <= {
        p.name for p in out.iterdir()
    }
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {str(i): name for i, name in enumerate(NLI_LABELS)} and config["label2id"]["neutral"] == 1
    assert config["headprune_heads_per_layer"] == {"enc_self": {"query_heads": [2, 4, 3], "kv_heads": [2, 4, 3]}}
    stock = AutoConfig.from_pretrained(out)  # the stock fields stay valid: the unpruned head count divides the width
    assert type(stock).__name__ == "BertConfig" and stock.num_attention_heads == 4 and stock.hidden_size % 4 == 0
    assert [i["name"] for i in description["graphs"]["model"]["inputs"]] == ["input_ids", "attention_mask", "token_type_ids"]
    assert description["graphs"]["model"]["outputs"] == [{"name": "logits", "type": "float32", "shape": ["batch", 3]}]

    with gates.masked(mask):
        reference = masked_predictions(model, minilm_tokenizer, PAIRS, description)
    answer = run_client(out, PAIRS)
    report = compare_predictions(answer, reference)
    assert report["passed"], report
    assert "onnxruntime" in answer["modules"] and "tokenizers" in answer["modules"] and not report["blocked_loaded"]
    assert answer["labels"] == reference["labels"] and set(answer["labels"]) <= set(NLI_LABELS)

    quantize_int8({"model": out / "model.onnx"}, out / "int8")  # the int8 directory is self-contained too
    int8 = run_client(out / "int8", PAIRS)
    assert int8["ids"] == reference["ids"] and set(int8["labels"]) <= set(NLI_LABELS)
    assert json.loads((out / "int8" / "headprune_export.json").read_text())["precision"].startswith("int8")


def test_a_pruned_llama_directory_continues_raw_text_without_torch(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    from headprune.models.tokenizers import train_tokenizer

    texts = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
    tokenizer = train_tokenizer(texts * 5, vocab_size=300)
    model = tiny_llama()
    model.resize_token_embeddings(len(tokenizer))
    for config in (model.config, model.generation_config):
        config.bos_token_id, config.eos_token_id, config.pad_token_id = (
            tokenizer.bos_token_id,
            tokenizer.eos_token_id,
            tokenizer.pad_token_id,
        )
    removed = {"dec_self": {0: [1], 1: [0, 1, 2, 3]}}  # uneven query heads per KV head, and an emptied layer
    out = tmp_path / "onnx"
    gates, mask, description = exported(model, tokenizer, removed, (texts[:2],), out)
    config = json.loads((out / "config.json").read_text())
    assert config["headprune_heads_per_layer"] == {"dec_self": {"query_heads": [3, 0, 4], "kv_heads": [2, 0, 2]}}
    assert config["use_cache"] is False and (out / "generation_config.json").is_file()
    stock = AutoConfig.from_pretrained(out)
    assert (stock.num_attention_heads, stock.num_key_value_heads) == (4, 2)  # the unpruned counts: a valid LlamaConfig
    assert description["task"] == "text-generation" and description["text_inputs"]["prepend_token_id"] == tokenizer.bos_token_id
    settings = json.loads((out / "tokenizer_config.json").read_text())  # names transformers 4 reads too (optimum-onnx 0.1)
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast" and settings["add_prefix_space"] is True
    saved = AutoTokenizer.from_pretrained(out)
    assert [saved(t, add_special_tokens=False)["input_ids"] for t in PROMPTS] == [
        tokenizer(t, add_special_tokens=False)["input_ids"] for t in PROMPTS
    ]

    with gates.masked(mask):
        reference = masked_predictions(model, tokenizer, PROMPTS, description, new_tokens=6)
    answer = run_client(out, PROMPTS, new_tokens=6)
    report = compare_predictions(answer, reference)
    assert report["passed"] and report["greedy_equal"], report
    assert answer["new_text"][0] == tokenizer.decode(reference["new_ids"][0], skip_special_tokens=True)
    assert all(ids[0] == tokenizer.bos_token_id for ids in answer["ids"])
