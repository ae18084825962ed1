"""A Llama with whole layers removed, exported: a stock HF checkpoint, ONNX and GGUF, each checked against the masked original."""

from __future__ import annotations

import copy
import json

import torch
from test_export_formats import TRAINED_PRE, checked, inputs
from tiny_llms import lm_batch, tiny_llama

from headprune.core.layer_removal import remove_layers
from headprune.core.units import unit_gates
from headprune.export import export_model
from headprune.export.verify import eos_and_pad, greedy_tokens, reference_logits

REMOVED = {"dec_layer": [0, 2]}  # of 4 layers: the first and a middle one go, layers 1 and 3 stay


def _masked_reference(model, batches, prompt):
    """Logits and greedy tokens of ``model`` with the REMOVED layers gated to the identity."""
    gates = unit_gates(model, "layer")
    mask = gates.ones()
    for group, ids in REMOVED.items():
        mask[group][ids] = 0
    with gates.masked(mask):
        reference, tokens = reference_logits(model, batches), greedy_tokens(model, prompt, 6)
    gates.remove()
    return reference, tokens


def _job(fmt, model, tokenizer, out, batches, **options):
    """(job, batches, masked reference, greedy) of the layer-pruned copy of ``model`` exported to ``fmt``, for ``checked``."""
    prompt = batches[0]["input_ids"][:2, :4]
    reference, tokens = _masked_reference(model, batches, prompt)
    pruned = copy.deepcopy(model)
    remove_layers(pruned, REMOVED)
    unit_gates(pruned, "layer").remove()
    exported = export_model(fmt, pruned, tokenizer, out, batches[0], **options)
    return exported["job"], batches, reference, (prompt, tokens, *eos_and_pad(model), 6)


def test_stock_hf_and_onnx_of_a_layer_pruned_llama(tmp_path):
    model = tiny_llama(layers=4)
    batches = [inputs(lm_batch(seed=s, batch=2 + s, length=6 + 3 * s)) for s in range(2)]
    items = [_job(fmt, model, None, tmp_path / fmt, batches) for fmt in ("hf", "onnx")]
    for report in checked(items):
        assert report["passed"] and report["greedy_equal"]
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and not any(key.startswith("headprune") for key in config)


def test_gguf_of_a_layer_pruned_llama_reads_back_with_its_kept_layers(tmp_path):
    import gguf
    import numpy as np

    from headprune.export.gguf import permute_rotary
    from headprune.export.verify import sample_texts
    from headprune.models.tokenizers import train_tokenizer

    texts = [f"the {w} sat on the {v} mat" for w in ("cat", "dog", "bird") for v in ("red", "blue", "green")]
    tokenizer = train_tokenizer(texts * 5, vocab_size=300)
    encoded = tokenizer(texts[:4], return_tensors="pt", padding=True)
    batches = [{"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}]
    torch.manual_seed(0)
    model = tiny_llama(layers=4)
    model.resize_token_embeddings(len(tokenizer))
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    job, *rest = _job("gguf", model, tokenizer, tmp_path, batches, gguf_dtype="f32", tokenizer_pre=TRAINED_PRE)
    (report,) = checked([({**job, **sample_texts(tokenizer, batches)}, *rest)])
    assert report["passed"] and report["greedy_equal"]
    reader = gguf.GGUFReader(str(next(tmp_path.glob("*.gguf"))))
    assert reader.fields["llama.block_count"].contents() == 2
    tensors = {t.name: t for t in reader.tensors}
    assert "blk.1.attn_q.weight" in tensors and "blk.2.attn_q.weight" not in tensors
    q = model.model.layers[3].self_attn.q_proj.weight.detach()  # original layer 3 is the file's block 1
    stored = np.asarray(tensors["blk.1.attn_q.weight"].data, dtype=np.float32).reshape(q.shape)
    assert np.allclose(stored, permute_rotary(q, 4).numpy())
