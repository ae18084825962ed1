"""GGUF files of globally pruned Llama models as llama.cpp's deci: per-layer head counts, emptied layers, refusals."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from test_export_formats import TRAINED_PRE, checked, masked_reference
from tiny_llms import tiny_llama

from headprune.core.attention.gates import HeadGates
from headprune.core.checks import ConfigError
from headprune.core.pruning import prune_heads
from headprune.export import export_model
from headprune.export.gguf_deci import mask_layer_shapes
from headprune.export.gguf_numpy import GGUFDecoder, read_layout
from headprune.export.verify import eos_and_pad, sample_texts

# tiny_llama(layers=4): 4 query heads over 2 KV heads (KV head k serves query heads 2k, 2k+1) in every layer
UNEVEN = {0: [], 1: [2, 3], 2: [0, 1, 2, 3], 3: [1, 2]}  # 4/2, KV group 0 only (2/1), emptied, one head per group (2/2)
LAYER0_EMPTIED = {0: [0, 1, 2, 3], 1: [], 2: [0, 2], 3: [0, 1]}  # layer 0 emptied: written as one all-zero head (1/1)


@pytest.fixture(scope="module")
def tokenizer():
    from headprune.models.tokenizers import train_tokenizer

    texts = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
    return train_tokenizer(texts * 5, vocab_size=300)


def tiny_model(tokenizer):
    model = tiny_llama(layers=4)
    model.resize_token_embeddings(len(tokenizer))
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    return model


def batches_of(tokenizer) -> list[dict]:
    encoded = tokenizer(["the cat sat on the red mat", "a dog near town", "the bird"], return_tensors="pt", padding=True)
    return [{"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}]


def pruned_copy(model, removed: dict):
    pruned = copy.deepcopy(model)
    prune_heads(pruned, {"dec_self": removed})
    HeadGates(pruned).remove()
    return pruned


@pytest.mark.parametrize(
    ("removed", "heads", "kv_heads"),
    [(UNEVEN, [4, 2, 0, 2], [2, 1, 0, 2]), (LAYER0_EMPTIED, [1, 4, 2, 2], [1, 2, 2, 1])],
    ids=["emptied-middle-layer", "emptied-layer-0"],
)
def test_global_masks_write_deci_with_the_models_layout(tokenizer, tmp_path, removed, heads, kv_heads):
    model = tiny_model(tokenizer)
    pruned = pruned_copy(model, removed)
    path = export_model("gguf", pruned, tokenizer, tmp_path, {}, gguf_dtype="f32", tokenizer_pre=TRAINED_PRE)["files"][0]
    layout = read_layout(str(path))
    assert (layout["architecture"], layout["head_count"], layout["head_count_kv"]) == ("deci", heads, kv_heads)
    assert layout["feed_forward_length"] == [model.config.intermediate_size] * 4
    hidden, head_dim = model.config.hidden_size, model.config.head_dim
    for layer, (h, kv) in enumerate(zip(heads, kv_heads)):
        attention = {f"blk.{layer}.attn_{p}.weight" for p in ("q", "k", "v", "output", "norm")}
        if h == 0:  # no attention tensors and no attention norm for an emptied layer
            assert not attention & set(layout["tensors"])
            continue
        attn = pruned.model.layers[layer].self_attn
        assert layout["tensors"][f"blk.{layer}.attn_q.weight"] == [h * head_dim, hidden] == list(attn.q_proj.weight.shape)
        assert layout["tensors"][f"blk.{layer}.attn_k.weight"] == [kv * head_dim, hidden] == list(attn.k_proj.weight.shape)
        assert layout["tensors"][f"blk.{layer}.attn_output.weight"] == [hidden, h * head_dim]
    if removed is LAYER0_EMPTIED:  # the placeholder head of layer 0 adds exactly nothing
        decoder = GGUFDecoder(str(path))
        assert all(not decoder.weights[f"blk.0.attn_{p}.weight"].any() for p in ("q", "k", "v", "output"))


def test_deci_files_reproduce_the_masked_model_in_the_checker(tokenizer, tmp_path):
    from headprune.export.gguf import rounded_like_gguf
    from headprune.export.verify import greedy_tokens, reference_logits

    model = tiny_model(tokenizer)
    batches = batches_of(tokenizer)
    prompt = batches[0]["input_ids"][:2, :3]
    items = []
    for name, removed in (("middle", UNEVEN), ("layer0", LAYER0_EMPTIED)):
        reference, tokens = masked_reference(model, {"dec_self": removed}, batches, prompt)
        pruned = pruned_copy(model, removed)
        for dtype in ("f32", "f16"):
            if dtype == "f16":  # the reference holds the matrices as the file does
                source = rounded_like_gguf(pruned, dtype)
                reference, tokens = reference_logits(source, batches), greedy_tokens(source, prompt, 6)
            exported = export_model(
                "gguf", pruned, tokenizer, tmp_path / f"{name}-{dtype}", batches[0], gguf_dtype=dtype, tokenizer_pre=TRAINED_PRE
            )
            assert exported["architecture"] == "deci"
            job = {**exported["job"], **sample_texts(tokenizer, batches)}
            items.append((job, batches, reference, (prompt, tokens, *eos_and_pad(pruned), 6)))
    for report in checked(items):
        assert report["passed"] and report["layout_equal"] and report["greedy_equal"], report
        assert report["architecture"] == "deci" and report["max_abs_diff"] <= report["tolerance"]


def test_the_numpy_reader_runs_a_uniform_llama_file_as_transformers_runs_the_model(tokenizer, tmp_path):
    model = tiny_model(tokenizer)
    pruned = pruned_copy(model, {layer: [2, 3] for layer in range(4)})  # one shape everywhere: llama.cpp's llama
    exported = export_model("gguf", pruned, tokenizer, tmp_path, {}, gguf_dtype="f32", tokenizer_pre=TRAINED_PRE)
    assert exported["architecture"] == "llama"
    batch = batches_of(tokenizer)[0]
    with torch.no_grad():
        expected = pruned(**batch).logits.numpy()
    got = GGUFDecoder(str(exported["files"][0])).logits(batch["input_ids"].numpy(), batch["attention_mask"].numpy())
    assert np.abs(got - expected).max() <= 1e-5 * max(1.0, np.abs(expected).max())


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        ([[1, 1, 1, 1], [1, 1, 1, 0]], "layer 1 keeps \\[2, 1\\] query heads"),  # unequal groups under the KV heads
        ([[1, 0, 1, 1], [1, 1, 1, 1]], "prune.unit=kv_group"),
    ],
)
def test_query_head_masks_with_unequal_groups_are_refused_before_and_at_export(tokenizer, tmp_path, rows, match):
    with pytest.raises(ConfigError, match=match):
        mask_layer_shapes(rows, heads_per_kv=2)
    removed = {layer: [h for h, keep in enumerate(row) if not keep] for layer, row in enumerate(rows)}
    pruned = pruned_copy(tiny_model(tokenizer), removed)
    with pytest.raises(ConfigError, match="export.format=onnx"):
        export_model("gguf", pruned, tokenizer, tmp_path / "refused", {})
    assert not (tmp_path / "refused").exists()


def test_mask_shapes_of_a_global_mask(tokenizer):
    rows = [[1, 1, 1, 1], [1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 0]]
    assert mask_layer_shapes(rows, heads_per_kv=2) == [(4, 2), (2, 1), (0, 0), (2, 2)]
