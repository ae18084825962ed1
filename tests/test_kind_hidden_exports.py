"""Models with residual channels removed, exported (ONNX, stock HF, GGUF llama and deci, DeciLM for vLLM) and checked against
the masked model in a fresh interpreter."""

from __future__ import annotations

import copy
import json

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


def _channels(gates, kept: int) -> dict:
    """A mask of ``gates`` keeping every unit but all except ``kept`` residual channels."""
    return {**gates.ones(), "hidden": _mask(gates.groups["hidden"][1], kept)}


def _joint(gates, kept: int) -> dict:
    """A ``[kv_group, ffn, hidden]`` mask: KV group 0 of layer 1 gone, layer 2's FFN cut to 40 neurons, ``kept`` channels."""
    mask = _channels(gates, kept)
    mask["dec_self"][1, 0] = 0
    mask["dec_ffn"][2, 40:] = 0
    return mask


def _prepared(model, kept, batches, tmp_path, fmt, tokenizer=None, prompt=None, unit="hidden", mask_of=_channels, **options):
    """(job, batches, masked reference, greedy) of a copy of ``model`` pruned in ``unit`` by ``mask_of(gates, kept)`` (default:
    all but ``kept`` residual channels removed)."""
    gates = unit_gates(model, unit)
    mask = mask_of(gates, kept)
    with gates.masked(mask):
        reference = reference_logits(model, batches)
        tokens = None if prompt is None else greedy_tokens(model, prompt, 6)
    gates.remove()
    pruned = copy.deepcopy(model)
    pruned_gates = unit_gates(pruned, unit)
    prune_unit_mask(pruned_gates, mask)
    pruned_gates.remove()
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


def _tokenized_llama(layers: int):
    """(a tiny Llama with a trained byte-level BPE tokenizer, that tokenizer, a padded batch list, a greedy prompt)."""
    from headprune.models.tokenizers import train_tokenizer

    texts = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
    tokenizer = train_tokenizer(texts * 5, vocab_size=300)
    encoded = tokenizer(texts[:4], return_tensors="pt", padding=True)
    batches = [{"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}]
    model = tiny_llama(layers=layers)
    model.resize_token_embeddings(len(tokenizer))
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    return model, tokenizer, batches, encoded["input_ids"][:2, :3]


def test_stock_hf_and_gguf_of_a_llama_with_channels_removed(tmp_path):
    from headprune.export.verify import sample_texts

    model, tokenizer, batches, prompt = _tokenized_llama(layers=2)
    hf = _prepared(model, 16, batches, tmp_path / "hf", "hf", tokenizer, prompt)
    job, batches, reference, greedy = _prepared(
        model, 16, batches, tmp_path / "gguf", "gguf", tokenizer, prompt, gguf_dtype="f32", tokenizer_pre=TRAINED_PRE
    )
    gguf = ({**job, **sample_texts(tokenizer, batches)}, batches, reference, greedy)
    for report in checked([hf, gguf]):
        assert report["passed"] and report["greedy_equal"]


def test_deci_gguf_and_deci_hf_of_channels_pruned_with_kv_groups_and_neurons(tmp_path):
    """prune.unit=[kv_group,ffn,hidden] with 21 of 32 channels kept (no multiple of the 4 heads: LlamaConfig refuses it): the
    file holds the kept width and the original head size, and reproduces the masked model in numpy (deci GGUF) and in
    the torch forward of its block_configs (DeciLM, its config built by the shipped class); channels alone go to deci too."""
    from gguf import GGUFReader

    from headprune.export.verify import sample_texts

    model, tokenizer, batches, prompt = _tokenized_llama(layers=4)
    joint = {"unit": ["kv_group", "ffn", "hidden"], "mask_of": _joint}
    job, batches, reference, greedy = _prepared(
        model, 21, batches, tmp_path / "gguf", "gguf", tokenizer, prompt, gguf_dtype="f32", tokenizer_pre=TRAINED_PRE, **joint
    )
    gguf = ({**job, **sample_texts(tokenizer, batches)}, batches, reference, greedy)
    deci_hf = _prepared(model, 21, batches, tmp_path / "deci_hf", "deci_hf", tokenizer, prompt, **joint)
    channels, *rest = _prepared(
        model, 21, batches, tmp_path / "uniform", "gguf", tokenizer, prompt, gguf_dtype="f32", tokenizer_pre=TRAINED_PRE
    )
    assert channels["architecture"] == "deci"  # one shape in every layer, but 4 heads do not divide 21 channels: no llama file
    uniform = ({**channels, **sample_texts(tokenizer, batches)}, *rest)
    for report in checked([gguf, deci_hf, uniform]):
        assert report["passed"] and report["layout_equal"] and report["greedy_equal"], report
    fields = GGUFReader(str(tmp_path / "gguf" / job["gguf_file"])).fields
    header = {key: int(fields[f"deci.{key}"].contents()) for key in ("embedding_length", "attention.key_length", "attention.value_length")}
    assert header == {"embedding_length": 21, "attention.key_length": 8, "attention.value_length": 8}
    assert job["layout"]["head_count_kv"] == [2, 1, 2, 2] and job["layout"]["feed_forward_length"] == [64, 64, 40, 64]
    config = json.loads((tmp_path / "deci_hf" / "config.json").read_text())
    assert (config["hidden_size"], config["head_dim"], config["num_attention_heads"]) == (21, 8, 4)
    assert not [key for key in config if key.startswith("headprune_")]  # pruning records stay out of the file
