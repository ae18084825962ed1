"""The export's check passes the correct GGUF file and refuses wrong ones (a head's weights swapped, a wrong RoPE base, a
wrong pre-tokenizer), with a tolerance from the f32 round-off measured on the model; a refused export never replaces a
good one; the pre-tokenizer a file names is chosen, recorded or identified, never ``default`` in silence."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json

import numpy as np
import pytest
import torch
from experiment_helpers import make_cfg, results
from test_export_formats import TRAINED_PRE, checked, masked_reference
from tiny_llms import tiny_llama

from headprune.core.attention.gates import HeadGates
from headprune.core.checks import ConfigError
from headprune.core.pruning import prune_heads
from headprune.export import export_model
from headprune.export.verify import ROUNDOFF_MULTIPLE, eos_and_pad, exact_logits, f32_roundoff, reference_logits, sample_texts

TEXTS = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
REMOVED = {0: [2, 3], 1: [0, 1]}  # one KV group of two in each layer: llama.cpp's llama, 2 query heads over 1 KV head


@pytest.fixture(scope="module")
def tokenizer():
    from headprune.models.tokenizers import train_tokenizer

    return train_tokenizer(TEXTS * 5, vocab_size=300)


def tiny_model(tokenizer):
    model = tiny_llama(layers=2)
    model.resize_token_embeddings(len(tokenizer))
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(4.0)  # larger logits than at init: a wrong weight shows well above the round-off
    for config in (model.config, model.generation_config):
        config.eos_token_id, config.pad_token_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    return model


def swap_one_head(model) -> None:
    """Give query head 0 of layer 0 the query rows of head 1 and head 1 those of head 0 (their outputs stay in place)."""
    weight = model.model.layers[0].self_attn.q_proj.weight
    dim = model.config.head_dim
    with torch.no_grad():
        weight[: 2 * dim] = torch.cat([weight[dim : 2 * dim], weight[:dim]]).clone()


def test_the_check_passes_the_correct_file_and_refuses_a_swapped_head_a_wrong_rope_base_and_a_wrong_pre_tokenizer(tokenizer, tmp_path):
    model = tiny_model(tokenizer)
    encoded = tokenizer(TEXTS[:4], return_tensors="pt", padding=True)
    batches = [{"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}]
    prompt = encoded["input_ids"][:2, :3]
    reference, tokens = masked_reference(model, {"dec_self": REMOVED}, batches, prompt)
    pruned = copy.deepcopy(model)
    prune_heads(pruned, {"dec_self": REMOVED})
    HeadGates(pruned).remove()
    roundoff = f32_roundoff([reference, reference_logits(pruned, batches)], exact_logits(pruned, batches))
    assert 0 < roundoff < 1e-4 * float(np.abs(reference[0]).max())  # f32 arithmetic of a 2-layer model

    swapped, wrong_rope = copy.deepcopy(pruned), copy.deepcopy(pruned)
    swap_one_head(swapped)
    wrong_rope.config.rope_parameters = {**wrong_rope.config.rope_parameters, "rope_theta": 100.0}  # 10000 in the model
    files = {
        "correct": (pruned, TRAINED_PRE),
        "head swapped": (swapped, TRAINED_PRE),
        "wrong rope base": (wrong_rope, TRAINED_PRE),
        "wrong pre-tokenizer": (pruned, "llama-bpe"),
    }
    items = []
    for name, (written, pre) in files.items():
        exported = export_model("gguf", written, tokenizer, tmp_path / name.replace(" ", "-"), batches[0], tokenizer_pre=pre)
        job = {
            **exported["job"],
            **sample_texts(tokenizer, batches),
            "f32_roundoff": roundoff,
            "roundoff_multiple": ROUNDOFF_MULTIPLE,
            "causal": True,
            "tokenizer_pre": TRAINED_PRE,  # the name chosen for the model's tokenizer
        }
        items.append((job, batches, reference, (prompt, tokens, *eos_and_pad(pruned), 6)))
    reports = dict(zip(files, checked(items)))
    good = reports["correct"]
    assert good["passed"] and good["tokenizer_pre"] == TRAINED_PRE and good["greedy_equal"], good
    assert good["tolerance"] == pytest.approx(max(good["tolerance_floor"], ROUNDOFF_MULTIPLE * roundoff))
    assert good["perplexity_rel_diff"] <= 1e-5
    for name in ("head swapped", "wrong rope base"):
        bad = reports[name]
        assert not bad["passed"] and not bad["outputs_match"], (name, bad)
        assert bad["max_abs_diff"] > 100 * bad["tolerance"], (name, bad)  # far beyond any round-off
    bad = reports["wrong pre-tokenizer"]
    assert not bad["passed"] and bad["outputs_match"] and not bad["tokenizer_pre_equal"], bad
    assert (bad["tokenizer_pre"], bad["tokenizer_pre_expected"]) == ("llama-bpe", TRAINED_PRE)


# ---- the pre-tokenizer: named, recorded, identified or refused (no llama.cpp) --------------------------------------


def saved_tokenizer(tokenizer, folder):
    tokenizer.save_pretrained(folder)
    return folder


def settings(pre=None) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.create({"tokenizer_pre": pre})


def test_the_pre_tokenizer_is_named_recorded_identified_or_refused(tokenizer, tmp_path, monkeypatch):
    from omegaconf import OmegaConf

    from headprune.export import llama_cpp_pre
    from headprune.export.gguf_pre import chktxt_hash, choose_tokenizer_pre
    from headprune.models.tokenizer_origin import RECORD

    plain = saved_tokenizer(tokenizer, tmp_path / "plain")
    model = OmegaConf.create({"name": "tiny_llama", "tokenizer": str(plain)})
    with pytest.raises(ConfigError, match="is not in llama.cpp's converter's table.*set export.tokenizer_pre="):
        choose_tokenizer_pre(settings(), model)
    with pytest.raises(ConfigError, match="trained by the task.*set export.tokenizer_pre="):
        choose_tokenizer_pre(settings(), OmegaConf.create({"name": "tiny_llama", "tokenizer": None}))
    named = choose_tokenizer_pre(settings("gpt-2"), model)
    assert (named["name"], named["how"], named["identified"]) == ("gpt-2", "export.tokenizer_pre", None)
    with pytest.raises(ConfigError, match="did you mean"):
        choose_tokenizer_pre(settings("gpt2"), model)

    recorded = saved_tokenizer(tokenizer, tmp_path / "recorded")
    (recorded / RECORD).write_text(json.dumps({"tokenizer_pre": "smollm", "from": "a source GGUF"}))
    chosen = choose_tokenizer_pre(settings(), OmegaConf.create({"name": "x", "tokenizer": str(recorded)}))
    assert (chosen["name"], chosen["how"]) == ("smollm", "a source GGUF")

    digest = chktxt_hash(tokenizer)
    assert digest == hashlib.sha256(str(tokenizer.encode(llama_cpp_pre.CHKTXT)).encode()).hexdigest()  # the converter's rule
    monkeypatch.setitem(llama_cpp_pre.NAME_BY_HASH, digest, "qwen2")  # as if llama.cpp's converter knew this tokenizer
    identified = choose_tokenizer_pre(settings(), model)
    assert (identified["name"], identified["identified"], identified["sha256"]) == ("qwen2", "qwen2", digest)


def test_a_saved_point_keeps_where_its_tokenizer_came_from(tokenizer, tmp_path):
    from headprune.models.tokenizer_origin import RECORD, keep_origin, read_origin

    source = saved_tokenizer(tokenizer, tmp_path / "source")
    (source / RECORD).write_text(json.dumps({"tokenizer_pre": "smollm", "from": "tokenizer.ggml.pre of model.gguf"}))
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(source)
    (tmp_path / "point").mkdir()
    assert keep_origin(loaded, tmp_path / "point") == read_origin(tmp_path / "point") == read_origin(source)
    (tmp_path / "other").mkdir()
    assert keep_origin(tokenizer, tmp_path / "other") is None and not (tmp_path / "other" / RECORD).exists()  # trained here


def test_the_embedded_smollm2_tokenizer_is_smollm_by_its_gguf_and_by_its_hash():
    pytest.importorskip("gguf")
    from headprune.models import embedded

    try:
        embedded.gguf_file("smollm2")
    except ModuleNotFoundError as err:
        pytest.skip(str(err))
    from headprune.export.gguf_pre import identify
    from headprune.models.tokenizer_origin import read_origin
    from headprune.models.tokenizers import load_tokenizer

    assert read_origin("smollm2")["tokenizer_pre"] == "smollm"
    assert read_origin(embedded.embedded_model_dir("smollm2"))["tokenizer_pre"] == "smollm"  # its converted directory
    assert identify(load_tokenizer("smollm2"))[0] == "smollm"


# ---- through the experiment: a refused export leaves the previous one whole ---------------------------------------

LM = ["data.tokenizer.vocab_size=300", "prune.unit=kv_group", "export.format=gguf", f"export.tokenizer_pre={TRAINED_PRE}"]


def run_export(tmp_path, mask_file):
    from hydra.utils import get_method

    from headprune.validation import validate

    cfg = make_cfg(tmp_path, "export", "lm", *LM, f"export.mask_file={mask_file}", "export.examples=8", "export.batch_size=4")
    validate(cfg)
    return get_method(cfg.run)(cfg)


def tree(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file() and ".export.next" not in str(p)}


def test_a_refused_export_leaves_the_previous_export_and_results_whole(tmp_path, monkeypatch):
    from headprune import export as formats

    mask = tmp_path / "mask.json"
    mask.write_text(json.dumps({"unit": "kv_group", "mask": {"dec_self": [[1, 0], [0, 1]]}}))
    out = tmp_path / "out"
    first = run_export(out, mask)
    assert first["check"]["passed"] and first["tokenizer_pre"]["name"] == TRAINED_PRE
    assert first["check"]["tolerance"] >= first["check"]["tolerance_floor"] and first["check"]["f32_roundoff"] > 0
    before = tree(out)

    gguf = formats.FORMATS["gguf"]

    def corrupt(model, tokenizer, folder, example, options):
        model = copy.deepcopy(model)
        swap_one_head(model)
        return gguf.write(model, tokenizer, folder, example, options)

    monkeypatch.setitem(formats.FORMATS, "gguf", dataclasses.replace(gguf, write=corrupt))
    with pytest.raises(ValueError, match="does not reproduce the masked model: its logits differ beyond the tolerance"):
        run_export(out, mask)
    assert tree(out) == before and results(out)["results"]["check"]["passed"]  # export/ and results.json untouched
    refused = out / ".export.next"
    assert json.loads((refused / "check.json").read_text())["outputs_match"] is False
    assert list((refused / "gguf").glob("*.gguf"))
    with pytest.raises(ValueError, match="does not reproduce"):
        run_export(tmp_path / "fresh", mask)
    assert not (tmp_path / "fresh" / "results.json").exists() and not (tmp_path / "fresh" / "export").exists()


# ---- the embedded SmolLM2 on every path: point, saved directory, mask -----------------------------------------------


@pytest.mark.slow  # SmolLM2 (30 layers) pruned with recovery and exported three times: minutes
def test_smollm2_gguf_names_smollm_and_passes_its_check_on_every_path(tmp_path):
    pytest.importorskip("gguf")
    from hydra.utils import get_method

    from headprune.models import embedded
    from headprune.models.tokenizer_origin import RECORD
    from headprune.validation import validate

    try:
        embedded.gguf_file("smollm2")
    except ModuleNotFoundError as err:
        pytest.skip(str(err))
    from experiment_helpers import compose_cfg

    small = [
        "model=smollm2",
        "data=lm_synthetic",
        "data.synthetic.sizes.eval=4",
        "data.synthetic.sizes.importance=8",
        "data.synthetic.sizes.heldout=4",
        "prune.unit=kv_group",
        "logger=none",
        "device=cpu",
    ]

    def run_real(path, experiment, *overrides):
        cfg = compose_cfg(path, [f"experiment={experiment}", *small, *overrides])
        validate(cfg)
        get_method(cfg.run)(cfg)
        return results(path)["results"]

    prune = ["prune.fractions=[0.333334]", "prune.min_units_per_layer=1", "prune.recover=lsq", "prune.recover_examples=8"]
    run = run_real(tmp_path / "prune", "prune", *prune)
    point = next(p for p in run.get("points") or run["pareto"]["points"] if p.get("model_dir"))
    name = f"importance+lsq@{point['step']}"
    assert json.loads((tmp_path / "prune" / point["model_dir"] / RECORD).read_text())["tokenizer_pre"] == "smollm"
    mask_file = f"export.mask_file={tmp_path / 'prune' / 'results.json'}"
    paths = {
        "point": [mask_file, f"export.point={name}"],
        "saved": [f"export.model={tmp_path / 'prune' / point['model_dir']}"],
        "mask": [mask_file, "export.mask_order=importance+lsq", f"export.mask_step={point['step']}"],
    }
    import gguf

    for path, overrides in paths.items():
        out = tmp_path / path
        result = run_real(out, "export", "export.format=gguf", "export.examples=4", "export.new_tokens=4", *overrides)
        check = result["check"]
        assert check["passed"] and check["tokenizer_pre"] == "smollm" and result["tokenizer_pre"]["identified"] == "smollm", path
        assert check["tolerance"] >= check["tolerance_floor"] and check["perplexity_rel_diff"] < 1e-4, (path, check)
        field = gguf.GGUFReader(str(out / result["files"][0])).fields["tokenizer.ggml.pre"]
        assert str(field.contents()) == "smollm", path


def test_the_float64_reference_of_a_sliding_window_model_is_finite_on_right_padding():
    """Gemma 2 padded beyond its sliding window: the f32 round-off is measured on the real positions, finite and small."""
    from tiny_llms import tiny_family

    model = tiny_family("gemma2", attn="eager")
    ids = torch.randint(3, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # 7 padded positions: the last queries' windows of 4 hold only padding
    batches = [{"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask}]
    computed, exact = reference_logits(model, batches), exact_logits(model, batches)
    real = mask.bool().numpy()
    assert np.isfinite(exact[0][real]).all() and np.isnan(exact[0][~real]).all()
    scale = float(np.abs(exact[0][real]).max())
    assert np.abs(computed[0][real] - exact[0][real]).max() <= 1e-5 * scale  # the f32 model's real positions, within round-off
    assert 0 < f32_roundoff([computed], exact) <= 1e-5 * scale
