"""Models with residual channels removed, exported (ONNX, stock HF, GGUF) and checked against the masked model in a fresh interpreter."""

from __future__ import annotations

import copy

import torch
from conftest import classifier_batch, seq2seq_batch, tiny_bert
from test_export_formats import TRAINED_PRE, checked
from tiny_encoders import tiny_t5
from tiny_llms import lm_batch, tiny_llama

from headprune.core.units import prune_unit_mask, unit_gates
from headprune.export import export_model
from headprune.export.verify import eos_and_pad, greedy_tokens, reference_logits


def _mask(width: int, kept: int) -> torch.Tensor:
    """A hard mask keeping ``kept`` channels spread over the width."""
    gen = torch.Generator().manual_seed(0)
    mask = torch.zeros(1, width)
    mask[0, torch.randperm(width, generator=gen)[:kept]] = 1
    return mask


def _prepared(model, kept, batches, tmp_path, fmt, tokenizer=None, prompt=None, **options):
    """(job, batches, masked reference, greedy) of a copy of ``model`` with all but ``kept`` residual channels removed."""
    gates = unit_gates(model, "hidden")
    mask = {"hidden": _mask(gates.groups["hidden"][1], kept)}
    with gates.masked(mask):
        reference = reference_logits(model, batches)
        tokens = None if prompt is None else greedy_tokens(model, prompt, 6)
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "hidden"), mask)
    unit_gates(pruned, "hidden").remove()
    exported = export_model(fmt, pruned, tokenizer, tmp_path, batches[0], **options)
    greedy = None if prompt is None else (prompt, tokens, *eos_and_pad(model), 6)
    return exported["job"], batches, reference, greedy


def test_onnx_of_bert_t5_and_llama_with_channels_removed(tmp_path):
    pair = seq2seq_batch()
    t5_batch = {"input_ids": pair["input_ids"], "attention_mask": pair["attention_mask"], "decoder_input_ids": pair["labels"].clamp(min=2)}
    bert_batch, llama_batch = classifier_batch(), lm_batch()
    items = [
        _prepared(tiny_bert(), 20, [{k: v for k, v in bert_batch.items() if k != "labels"}], tmp_path / "bert", "onnx"),
        _prepared(tiny_t5(), 20, [t5_batch], tmp_path / "t5", "onnx"),
        _prepared(tiny_llama(), 20, [{k: v for k, v in llama_batch.items() if k != "labels"}], tmp_path / "llama", "onnx"),
    ]
    for report in checked(items):
        assert report["passed"] and report["max_abs_diff"] <= 1e-5


def test_stock_hf_and_gguf_of_a_llama_with_channels_removed(tmp_path):
    from headprune.export.verify import sample_texts
    from headprune.models.tokenizers import train_tokenizer

    texts = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
    tokenizer = train_tokenizer(texts * 5, vocab_size=300)
    encoded = tokenizer(texts[:4], return_tensors="pt", padding=True)
    batches = [{"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}]
    prompt = encoded["input_ids"][:2, :3]
    model = tiny_llama(layers=2)
    model.resize_token_embeddings(len(tokenizer))
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    hf = _prepared(model, 16, batches, tmp_path / "hf", "hf", tokenizer, prompt)
    job, batches, reference, greedy = _prepared(
        model, 16, batches, tmp_path / "gguf", "gguf", tokenizer, prompt, gguf_dtype="f32", tokenizer_pre=TRAINED_PRE
    )
    gguf = ({**job, **sample_texts(tokenizer, batches)}, batches, reference, greedy)
    for report in checked([hf, gguf]):
        assert report["passed"] and report["greedy_equal"]
