"""experiment=export of vocab-pruned models: renumbered weights and the rewritten tokenizer, checked on text against the masked model."""

from __future__ import annotations

import json

import pytest
import torch
from experiment_helpers import make_cfg, results

from headprune.core.checks import ConfigError

LM = ["data.tokenizer.vocab_size=300"]  # a BPE vocabulary beyond the 256 byte tokens: some tokens can go
SMALL = ["export.examples=8", "export.batch_size=4"]
MT_TEXT = ["data.tokenizer.vocab_size=600"]  # merges the evaluation text never uses: a cut that leaves it split alike


def _run(tmp_path, experiment: str, task: str, *overrides) -> dict:
    from hydra.utils import get_method

    from headprune.validation import validate

    cfg = make_cfg(tmp_path, experiment, task, *(LM if task == "lm" else []), *overrides)
    validate(cfg)
    get_method(cfg.run)(cfg)
    return results(tmp_path)


@pytest.fixture(scope="module")
def vocab_masks(tmp_path_factory):
    """A vocab prune run of the LM, NLI and MT test tasks, and one of MT keeping its eval text's tokens: {name: its results.json}."""
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("vocab_prune")
    for task in ("lm", "nli", "mt"):
        _run(root / task, "prune", task, "prune.unit=vocab", "prune.fractions=[0.5]")
    _run(root / "mt_text", "prune", "mt", *MT_TEXT, "prune.unit=vocab", "prune.fractions=[0.5]", "prune.vocab_text=[eval]")
    return {task: root / task / "results.json" for task in ("lm", "nli", "mt", "mt_text")}


@pytest.mark.parametrize("fmt", ["hf", "onnx"])
def test_lm_export_ships_the_rewritten_tokenizer_and_matches_the_masked_model(vocab_masks, tmp_path, fmt):
    from transformers import AutoTokenizer

    result = _run(tmp_path, "export", "lm", f"export.format={fmt}", f"export.mask_file={vocab_masks['lm']}", *SMALL)["results"]
    check, removed = result["check"], result["removed_units"]["vocab"]
    assert check["passed"] and check["greedy_equal"] and check["tokenizer_equal"]
    assert check["max_abs_diff"] <= 1e-5 * max(1.0, check["reference_max_abs"])
    assert check["check_texts"] == check["split_alike"] + check["split_again"] == 8
    folder = tmp_path / "export" / fmt
    tokenizer, config = AutoTokenizer.from_pretrained(folder), json.loads((folder / "config.json").read_text())
    assert config["vocab_size"] == len(tokenizer) == 300 - removed > 0
    assert tokenizer.convert_ids_to_tokens(config["eos_token_id"]) == tokenizer.eos_token  # special ids renumbered alike


def test_nli_onnx_export_is_checked_on_text_both_tokenizers_split_alike(vocab_masks, tmp_path):
    result = _run(tmp_path, "export", "nli", "export.format=onnx", f"export.mask_file={vocab_masks['nli']}", *SMALL)["results"]
    check = result["check"]
    assert check["passed"] and check["tokenizer_equal"] and check["split_alike"] > 0
    assert check["max_abs_diff"] <= 1e-5 * max(1.0, check["reference_max_abs"])


def test_seq2seq_onnx_export_ships_the_rewritten_tokenizer_and_matches_the_masked_model(vocab_masks, tmp_path):
    """Marian (encoder, decoder, final_logits_bias): both graphs and the tokenizer on the kept ids, checked on text."""
    from transformers import AutoTokenizer

    for mask, rows, extra in (("mt", "split_again", []), ("mt_text", "split_alike", MT_TEXT)):  # text with removed tokens; without
        out = tmp_path / mask
        result = _run(out, "export", "mt", *extra, "export.format=onnx", f"export.mask_file={vocab_masks[mask]}", *SMALL)["results"]
        check, removed = result["check"], result["removed_units"]["vocab"]
        assert check["passed"] and check["tokenizer_equal"] and check[rows] > 0, (
            mask,
            {k: check[k] for k in ("check_texts", "split_alike", "split_again")},
        )
        assert check["max_abs_diff"] <= 1e-5 * max(1.0, check["reference_max_abs"])
        assert mask == "mt" or check["split_alike"] == check["check_texts"]  # vocab_text keeps both languages' tokens
        tokenizer, config = (
            AutoTokenizer.from_pretrained(out / "export" / "onnx"),
            json.loads((out / "export" / "onnx" / "config.json").read_text()),
        )
        assert config["vocab_size"] == len(tokenizer) and removed > 0
        assert tokenizer.convert_ids_to_tokens(config["eos_token_id"]) == tokenizer.eos_token


def test_formats_that_ship_the_original_tokenizer_are_refused_before_any_work(vocab_masks, tmp_path, monkeypatch):
    from headprune.tasks import registry
    from headprune.validation import validate

    monkeypatch.setattr(registry, "load_task", lambda cfg: pytest.fail("validation loaded the task"))
    mask = f"export.mask_file={vocab_masks['lm']}"
    cases = [
        (["export.format=deci_hf", mask], "pruned by vocab: export.format=deci_hf"),
        (["export.format=onnx", "export.quantize=int8", mask], "export.quantize=int8 .*renumbered ids"),
    ]
    for overrides, message in cases:
        with pytest.raises(ConfigError, match=message):
            validate(make_cfg(tmp_path / "cfg", "export", "lm", *LM, *overrides))
