"""A Llama with whole layers removed, exported: a stock HF checkpoint, ONNX and GGUF, each checked against the masked original."""

from __future__ import annotations

import copy
import json

import torch
from test_export_deci import batches_of, tiny_model
from test_export_deci_hf import HEADS, WIDTHS, _logit_gap, _mask
from test_export_formats import TRAINED_PRE, checked, inputs
from tiny_llms import lm_batch, tiny_llama

from headprune.core.kinds.kind_registry import mask_kinds
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.export import export_model
from headprune.export.deci_hf import export_deci_hf
from headprune.export.verify import eos_and_pad, greedy_tokens, reference_logits

REMOVED = {"dec_layer": [0, 2]}  # of 4 layers: the first and a middle one go, layers 1 and 3 stay


def _layer_mask(layers=4):
    """The REMOVED layers as a layer mask {group: [layers, 1]}."""
    mask = {group: torch.ones(layers, 1) for group in REMOVED}
    for group, ids in REMOVED.items():
        mask[group][ids] = 0
    return mask


def _job(fmt, model, tokenizer, out, batches, mask=None, **options):
    """(job, batches, masked reference, greedy) of the copy of ``model`` pruned by ``mask`` (default: the REMOVED layers)
    and exported to ``fmt``, for ``checked``."""
    mask = _layer_mask() if mask is None else mask
    gates = unit_gates(model, list(mask_kinds(mask)))
    prompt = batches[0]["input_ids"][:2, :4]
    with gates.masked(mask):
        reference, tokens = reference_logits(model, batches), greedy_tokens(model, prompt, 6)
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, list(mask_kinds(mask))), mask)
    unit_gates(pruned, "head").remove()  # the model's own attention, as the export experiment writes it
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

    tokenizer = tokenizer_of()
    model, batches = tiny_model(tokenizer), batches_of(tokenizer)
    uneven = {**_layer_mask(), "dec_self": torch.tensor([[1.0] * 4, [1, 1, 0, 0], [1.0] * 4, [0, 1, 1, 0]])}  # layers 1 and 3 kept
    items = []
    for name, mask in (("llama", None), ("deci", uneven)):
        job, *rest = _job("gguf", model, tokenizer, tmp_path / name, batches, mask, gguf_dtype="f32", tokenizer_pre=TRAINED_PRE)
        items.append(({**job, **sample_texts(tokenizer, batches)}, *rest))
    assert all(report["passed"] and report["greedy_equal"] for report in checked(items))
    readers = {name: gguf.GGUFReader(str(next((tmp_path / name).glob("*.gguf")))) for name in ("llama", "deci")}
    assert {name: r.fields["general.architecture"].contents() for name, r in readers.items()} == {"llama": "llama", "deci": "deci"}
    assert readers["deci"].fields["deci.block_count"].contents() == 2
    reader = readers["llama"]
    assert reader.fields["llama.block_count"].contents() == 2
    tensors = {t.name: t for t in reader.tensors}
    assert "blk.1.attn_q.weight" in tensors and "blk.2.attn_q.weight" not in tensors
    q = model.model.layers[3].self_attn.q_proj.weight.detach()  # original layer 3 is the file's block 1
    stored = np.asarray(tensors["blk.1.attn_q.weight"].data, dtype=np.float32).reshape(q.shape)
    assert np.allclose(stored, permute_rotary(q, 4).numpy())


def tokenizer_of():
    """A byte-level tokenizer trained on a few sentences (as the deci tests train theirs)."""
    from headprune.models.tokenizers import train_tokenizer

    texts = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
    return train_tokenizer(texts * 5, vocab_size=300)


def test_deci_hf_of_a_llama_without_its_first_layer_is_the_masked_model(tmp_path):
    """Uneven KV groups, uneven FFN widths and a no-op FFN in the layers kept, once layer 0 is gone: vLLM's DeciLM layout."""
    model = tiny_llama(layers=4)
    gates = unit_gates(model, "head+ffn+layer")
    mask = {**_mask(gates, HEADS, WIDTHS), "dec_layer": torch.tensor([[0.0], [1.0], [1.0], [1.0]])}
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "head+ffn+layer"), mask)
    unit_gates(pruned, "head").remove()
    written = export_deci_hf(pruned, None, tmp_path / "deci")
    gap, scale = _logit_gap(model, gates, mask, tmp_path / "deci")
    assert gap <= 1e-5 * max(1.0, scale)
    assert [layer["ffn"] for layer in written["layout"]] == WIDTHS[1:]
    assert json.loads((tmp_path / "deci" / "config.json").read_text())["num_hidden_layers"] == 3
