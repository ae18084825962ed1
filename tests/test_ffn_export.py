"""Exports of models pruned in FFN neurons beside KV groups: deci GGUF per-layer widths, stock HF widths, ONNX with uneven widths.

Each export is read back (the gguf package, a fresh interpreter without headprune) and compared with the masked model.
"""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from conftest import classifier_batch, tiny_bert
from test_export_deci import batches_of, tiny_model, tokenizer  # noqa: F401 - the module's tokenizer fixture
from test_export_formats import checked
from tiny_llms import tiny_llama

from headprune.core.attention.gates import HeadGates
from headprune.core.checks import ConfigError
from headprune.core.ffn.sites import find_ffn_sites
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.export import export_model, gguf_deci
from headprune.export.gguf_numpy import GGUFDecoder, read_layout
from headprune.export.verify import eos_and_pad, greedy_tokens, reference_logits, sample_texts

# tiny_llama(layers=4): 2 KV groups of 2 query heads, 64 neurons per block
KV_MASK = [[1, 1], [1, 0], [0, 0], [1, 1]]  # layer 2 without attention
FFN_KEPT = [40, 10, 0, 0]  # layer 2 without FFN either (written 0: skipped), layer 3 FFN-free beside attention (written 1)
LAYER0_KV = [[0, 0], [1, 1], [1, 0], [1, 1]]  # layer 0 without attention: written as one all-zero head
LAYER0_KEPT = [0, 64, 30, 5]  # and without FFN: its placeholder head runs, so its phantom neuron stays (written 1)
LAST_KV = [[1, 1], [1, 0], [1, 1], [0, 0]]  # the last layer without attention
LAST_KEPT = [40, 64, 17, 0]  # and without FFN: written 1 all the same (deci selects the output rows after the last FFN)


def joint_mask(kv_rows, kept) -> dict:
    """A KV-group + neuron mask: the KV groups of ``kv_rows``, and in layer l the neurons kept[l] (every third id first)."""
    ffn = torch.zeros(len(kept), 64)
    for layer, n in enumerate(kept):
        ids = (list(range(0, 64, 3)) + [i for i in range(64) if i % 3])[:n]
        ffn[layer, ids] = 1
    return {"dec_self": torch.tensor(kv_rows, dtype=torch.float32), "dec_ffn": ffn}


def masked_and_pruned(model, mask, batches, prompt):
    """(reference logits and greedy tokens of the masked model, the pruned copy with its own attention)."""
    gates = unit_gates(model, "kv_group+ffn")
    with gates.masked(mask):
        reference, tokens = reference_logits(model, batches), greedy_tokens(model, prompt, 6)
    gates.remove()
    pruned = copy.deepcopy(model)
    prune_unit_mask(unit_gates(pruned, "kv_group+ffn"), mask)
    HeadGates(pruned).remove()
    return reference, tokens, pruned


@pytest.mark.parametrize(
    ("kv_rows", "kept", "heads", "feed_forward"),
    [
        (KV_MASK, FFN_KEPT, [4, 2, 0, 4], [40, 10, 0, 1]),
        (LAYER0_KV, LAYER0_KEPT, [1, 4, 2, 4], [1, 64, 30, 5]),
        (LAST_KV, LAST_KEPT, [4, 2, 4, 0], [40, 64, 17, 1]),
    ],
    ids=["ffn-free-layers", "layer-0-emptied", "last-layer-emptied"],
)
def test_deci_gguf_holds_every_layer_s_ffn_width_and_reproduces_the_masked_model(tokenizer, tmp_path, kv_rows, kept, heads, feed_forward):  # noqa: F811
    model = tiny_model(tokenizer)
    batches = batches_of(tokenizer)
    prompt = batches[0]["input_ids"][:2, :3]
    mask = joint_mask(kv_rows, kept)
    reference, tokens, pruned = masked_and_pruned(model, mask, batches, prompt)
    assert [s.width for s in find_ffn_sites(pruned)] == kept
    exported = export_model("gguf", pruned, tokenizer, tmp_path, batches[0], gguf_dtype="f32", tokenizer_pre="gpt-2")
    path = str(exported["files"][0])
    layout = read_layout(path)  # the gguf package reads the file back
    assert (layout["architecture"], layout["head_count"], layout["feed_forward_length"]) == ("deci", heads, feed_forward)
    assert exported["job"]["layout"]["feed_forward_length"] == feed_forward
    for layer, width in enumerate(feed_forward):
        ffn = {f"blk.{layer}.ffn_{p}.weight" for p in ("gate", "up", "down", "norm")}
        assert (ffn <= set(layout["tensors"])) == (width > 0) and (ffn & set(layout["tensors"]) == set()) == (width == 0)
        if width:
            assert layout["tensors"][f"blk.{layer}.ffn_up.weight"] == [width, model.config.hidden_size]
    got = GGUFDecoder(path).logits(batches[0]["input_ids"].numpy(), batches[0]["attention_mask"].numpy())
    assert np.abs(got - reference[0]).max() <= 1e-5 * max(1.0, float(np.abs(reference[0]).max()))
    job = {**exported["job"], **sample_texts(tokenizer, batches)}
    (report,) = checked([(job, batches, reference, (prompt, tokens, *eos_and_pad(pruned), 6))])
    assert report["passed"] and report["layout_equal"] and report["greedy_equal"], report


def test_an_ffn_free_layer_beside_attention_would_lose_its_attention_in_deci(tokenizer, tmp_path, monkeypatch):  # noqa: F811
    """Why an emptied FFN beside attention keeps its phantom neuron: deci's graph ends an FFN-free layer before the residual."""
    model = tiny_model(tokenizer)
    batches = batches_of(tokenizer)
    reference, _, pruned = masked_and_pruned(model, joint_mask(KV_MASK, FFN_KEPT), batches, batches[0]["input_ids"][:1, :2])
    monkeypatch.setattr(gguf_deci, "written_ffn_widths", lambda shapes, widths: list(widths))  # 0 for every emptied block
    path = str(export_model("gguf", pruned, tokenizer, tmp_path, batches[0], gguf_dtype="f32", tokenizer_pre="gpt-2")["files"][0])
    assert read_layout(path)["feed_forward_length"] == [40, 10, 0, 0]
    got = GGUFDecoder(path).logits(batches[0]["input_ids"].numpy(), batches[0]["attention_mask"].numpy())
    assert np.abs(got - reference[0]).max() > 1e-3 * float(np.abs(reference[0]).max())  # layer 3's attention is gone


def test_uniform_ffn_widths_write_llama_gguf_and_a_stock_hf_checkpoint(tokenizer, tmp_path):  # noqa: F811
    model = tiny_model(tokenizer)
    batches = batches_of(tokenizer)
    prompt = batches[0]["input_ids"][:2, :3]
    mask = joint_mask([[1, 0]] * 4, [24] * 4)
    reference, tokens, pruned = masked_and_pruned(model, mask, batches, prompt)
    items = []
    for fmt in ("gguf", "hf"):
        exported = export_model(fmt, pruned, tokenizer, tmp_path / fmt, batches[0], gguf_dtype="f32", tokenizer_pre="gpt-2")
        items.append(
            ({**exported["job"], **sample_texts(tokenizer, batches)}, batches, reference, (prompt, tokens, *eos_and_pad(pruned), 6))
        )
        if fmt == "gguf":
            assert exported["architecture"] == "llama" and read_layout(str(exported["files"][0]))["feed_forward_length"] == [24] * 4
        else:
            config = json.loads((tmp_path / "hf" / "config.json").read_text())
            assert config["intermediate_size"] == 24 and "headprune_ffn_widths" not in config
    for report in checked(items):
        assert report["passed"] and report["greedy_equal"], report


def test_uneven_ffn_widths_are_refused_by_stock_hf_with_the_layers_of_each_width(tokenizer, tmp_path):  # noqa: F811
    model = tiny_model(tokenizer)
    _, _, pruned = masked_and_pruned(
        model, joint_mask([[1, 1]] * 4, [40, 40, 10, 0]), batches_of(tokenizer), batches_of(tokenizer)[0]["input_ids"][:1, :2]
    )
    with pytest.raises(
        ConfigError, match=r"one FFN width \(intermediate_size\) in every layer, but layers \[0, 1\]: 40 neurons; layers \[2\]: 10"
    ):
        export_model("hf", pruned, tokenizer, tmp_path, {})


def test_onnx_runs_uneven_ffn_widths_and_says_them(tmp_path):
    items = []
    llama_batches = [{"input_ids": torch.randint(3, 64, (2, 7)), "attention_mask": torch.ones(2, 7, dtype=torch.long)}]
    bert_batches = [{k: v for k, v in classifier_batch(batch=3).items() if k != "labels"}]
    for name, make, unit, batches in (
        ("llama", lambda: tiny_llama(layers=4), "kv_group+ffn", llama_batches),
        ("bert", tiny_bert, "head+ffn", bert_batches),
    ):
        model = make()
        gates = unit_gates(model, unit)
        mask = gates.ones()
        ffn_group = next(g for g in mask if g.endswith("_ffn"))
        mask[ffn_group] = joint_mask([[1]] * mask[ffn_group].shape[0], [40, 10, 0, 64][: mask[ffn_group].shape[0]])["dec_ffn"]
        with gates.masked(mask):
            reference = reference_logits(model, batches)
        gates.remove()
        pruned = copy.deepcopy(model)
        prune_unit_mask(unit_gates(pruned, unit), mask)
        HeadGates(pruned).remove()
        exported = export_model("onnx", pruned, None, tmp_path / name, batches[0])
        description = json.loads((tmp_path / name / "headprune_export.json").read_text())
        assert description["ffn_widths_per_layer"] == {ffn_group: [40, 10, 0, 64][: mask[ffn_group].shape[0]]}
        items.append((exported["job"], batches, reference, None))
    for report in checked(items):
        assert report["passed"], report
