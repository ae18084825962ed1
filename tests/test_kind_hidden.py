"""The hidden kind: residual channels gated (hard mask == pruned model for every family row), scored, removed, saved and loaded."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import classifier_batch, seq2seq_batch, tiny_bart, tiny_bert, tiny_marian, tiny_roberta
from tiny_encoders import FAMILY_MODELS, image_batch, tiny_deit, tiny_distilbert, tiny_t5, tiny_vit
from tiny_llms import DECODER_CONFIGS, causal_lm_loss, lm_batch, tiny_decoder, tiny_family, tiny_llama, tiny_qwen2

from headprune.core.counting import model_cost
from headprune.core.kinds import KINDS
from headprune.core.saving import RECORD_FILE, load_pruned, save_pruned
from headprune.core.units import prune_unit_mask, unit_gates
from headprune.scoring.importance import per_example_gate_gradients


def _seq2seq(decoder_floor: int = 0):
    batch = seq2seq_batch()
    return dict(batch, decoder_input_ids=batch["labels"].clamp(min=decoder_floor))


ROWS = {
    "llama": (tiny_llama, lm_batch),
    "qwen2": (tiny_qwen2, lm_batch),
    "mistral": (lambda: tiny_decoder("mistral"), lm_batch),
    "qwen3": (lambda: tiny_decoder("qwen3"), lm_batch),
    **{t: (lambda t=t: tiny_family(t, attn="eager" if t == "gemma2" else "sdpa"), lm_batch) for t in DECODER_CONFIGS},
    "bert": (tiny_bert, classifier_batch),
    "roberta": (tiny_roberta, classifier_batch),
    "distilbert": (tiny_distilbert, lambda: classifier_batch(vocab=50)),
    "vit": (tiny_vit, image_batch),
    "deit": (tiny_deit, image_batch),
    "t5": (tiny_t5, _seq2seq),
    "mt5": (lambda: tiny_t5(0, "mt5"), _seq2seq),
    "marian": (tiny_marian, _seq2seq),
    "bart": (tiny_bart, lambda: _seq2seq(2)),
}
REFUSED = {"whisper": "audio convolutions", "deberta-v2": "relative-position embeddings"}


def _logits(model, batch):
    with torch.no_grad():
        return model(**{k: v for k, v in batch.items() if k != "labels"}).logits


def _pruned_and_reloaded_equal_masked(model, gates, mask, batch, tmp_path):
    """The pruned model, and it saved and loaded again, give the masked model's logits within 1e-5 of their scale."""
    with gates.masked(mask):
        masked = _logits(model, batch)
    prune_unit_mask(gates, mask)
    assert (_logits(model, batch) - masked).abs().max() <= 1e-5 * masked.abs().max()
    save_pruned(model, tmp_path)
    loaded = load_pruned(tmp_path)
    assert (_logits(loaded, batch) - masked).abs().max() <= 1e-5 * masked.abs().max()


def _mask(width: int, seed: int = 0, batch: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    shape = (1, width) if batch is None else (batch, 1, width)
    mask = (torch.rand(shape, generator=gen) > 0.4).float()
    mask[..., 0] = 1  # at least one channel kept
    return mask


def _multiple_mask(width: int, multiple: int = 4) -> torch.Tensor:
    """A hard mask keeping a multiple of ``multiple`` channels (Llama's config asks hidden_size to be one of its heads)."""
    mask = _mask(width)
    kept = mask[0].nonzero().flatten()
    mask[0, kept[len(kept) - len(kept) % multiple :]] = 0
    return mask


def _pruned(model, mask):
    pruned = copy.deepcopy(model)
    record = prune_unit_mask(unit_gates(pruned, "hidden"), {"hidden": mask})
    return pruned, record


@pytest.mark.parametrize("row", list(ROWS))
def test_hard_mask_equals_the_pruned_model(row):
    make, batch_of = ROWS[row]
    model, batch = make(), batch_of()
    gates = unit_gates(model, "hidden")
    width = gates.groups["hidden"][1]
    mask = _mask(width)
    with gates.masked({"hidden": mask}):
        masked = _logits(model, batch)
    pruned, record = _pruned(model, mask)
    full = _logits(model, batch)
    scale = full.abs().max()
    assert (masked - full).abs().max() > 1e-3 * scale  # the mask does something
    assert (_logits(pruned, batch) - masked).abs().max() <= 1e-5 * scale
    assert pruned.config.hidden_size == int(mask.sum())
    assert record["hidden"] == {"hidden": {"0": (mask[0] == 0).nonzero().flatten().tolist()}}
    assert unit_gates(pruned, "hidden").present()["hidden"].equal(mask.bool())


@pytest.mark.parametrize("row", list(REFUSED))
def test_refused_families_name_the_reason(row):
    model = FAMILY_MODELS[row][0]()
    assert REFUSED[row] in KINDS["hidden"].available(model)
    with pytest.raises(ValueError, match=REFUSED[row]):
        unit_gates(model, "hidden")


@pytest.mark.parametrize("row", ["llama", "bert", "t5"])
def test_per_example_masks_equal_one_mask_at_a_time(row):
    make, batch_of = ROWS[row]
    model, batch = make(), batch_of()
    gates = unit_gates(model, "hidden")
    rows = batch["labels"].shape[0]
    masks = _mask(gates.groups["hidden"][1], seed=1, batch=rows)
    masks[0] = torch.rand(masks.shape[1:], generator=torch.Generator().manual_seed(2))  # a soft gate too
    with gates.masked({"hidden": masks}):
        together = _logits(model, batch)
    for b in range(rows):
        with gates.masked({"hidden": masks[b]}):
            alone = _logits(model, batch)[b]
        assert torch.allclose(together[b], alone, atol=1e-5 * alone.abs().max())


@pytest.mark.parametrize("row", ["gpt2", "bert"])
def test_a_deep_copy_counts_the_examples_of_its_own_base_model_calls(row):
    """Per-example masks on a deep copy called through its base model (the LM scorer's path), after a call of one example:
    the batch-shared position stream is gated per example of this call, not of the copy's or the original's last one."""
    make, batch_of = ROWS[row]
    model, batch = make(), batch_of()
    unit_gates(model, "hidden")
    twin = copy.deepcopy(model)
    gates = unit_gates(twin, "hidden")
    inputs = {k: v for k, v in batch.items() if k != "labels"}
    _logits(twin, {k: v[:1] for k, v in inputs.items()})
    masks = _mask(gates.groups["hidden"][1], seed=1, batch=batch["labels"].shape[0])
    with torch.no_grad(), gates.masked({"hidden": masks}):
        together = twin.base_model(**inputs).last_hidden_state
    for b in range(len(masks)):
        with torch.no_grad(), gates.masked({"hidden": masks[b]}):
            alone = twin.base_model(**inputs).last_hidden_state[b]
        assert torch.allclose(together[b], alone, atol=1e-5 * alone.abs().max())


def _losses(model, batch, row):
    if row in ("llama", "gpt2"):
        return causal_lm_loss(model(**{k: v for k, v in batch.items() if k != "labels"}), batch)
    logits = model(**{k: v for k, v in batch.items() if k != "labels"}).logits
    return (
        torch.nn.functional.cross_entropy(logits.transpose(1, -1) if logits.dim() == 3 else logits, batch["labels"], reduction="none")
        .reshape(logits.shape[0], -1)
        .sum(-1)
    )


@pytest.mark.parametrize("row", ["llama", "bert", "gpt2"])
def test_gate_gradient_equals_a_finite_difference(row):
    make, batch_of = ROWS[row]
    model, batch = make().double(), batch_of()
    gates = unit_gates(model, "hidden")
    width = gates.groups["hidden"][1]
    soft = 0.5 + 0.5 * torch.rand(1, width, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    grads = per_example_gate_gradients(
        model, gates, batch, loss_fn=lambda out, b: _losses_from(out, b, row), mask={"hidden": soft}, unit="hidden"
    )
    signed = grads["hidden"].sum(0)[0] / soft[0]  # probes give g * dL/dg
    eps = 1e-2  # the norms compute in float32 even in a float64 model: a smaller step drowns in their rounding
    for channel in (0, 5, width - 1):
        step = torch.zeros_like(soft)
        step[0, channel] = eps
        with torch.no_grad():
            with gates.masked({"hidden": soft + step}):
                up = _losses(model, batch, row).sum()
            with gates.masked({"hidden": soft - step}):
                down = _losses(model, batch, row).sum()
        numeric = (up - down) / (2 * eps)
        assert abs(signed[channel] - numeric) <= 2e-3 * signed.abs().max()


def _losses_from(outputs, batch, row):
    if row in ("llama", "gpt2"):
        return causal_lm_loss(outputs, batch)
    return torch.nn.functional.cross_entropy(outputs.logits, batch["labels"], reduction="none")


@pytest.mark.parametrize("row", ["llama", "bert", "gpt2", "t5", "vit"])
def test_flops_table_predicts_the_pruned_cost(row):
    make, batch_of = ROWS[row]
    model = make()
    mask = _mask(unit_gates(model, "hidden").groups["hidden"][1])
    table = KINDS["hidden"].flops_tables(model, 16)["hidden"]
    pruned, _ = _pruned(model, mask)
    kept, width = int(mask.sum()), mask.shape[1]
    assert model_cost(pruned, 16).flops == model_cost(model, 16).flops - table[0, width] + table[0, kept]
    assert model_cost(model, 16).hidden_flops == KINDS["hidden"].covered_flops(model_cost(model, 16)) == table[0, width]


@pytest.mark.parametrize("row", ["llama", "bert", "gpt2", "t5", "marian"])
def test_save_and_load_round_trip(row, tmp_path):
    make, batch_of = ROWS[row]
    model, batch = make(), batch_of()
    mask = _multiple_mask(unit_gates(model, "hidden").groups["hidden"][1])
    pruned, _ = _pruned(model, mask)
    save_pruned(pruned, tmp_path)
    record = json.loads((tmp_path / RECORD_FILE).read_text())
    assert record["kinds"]["hidden"]["pruned_channels"] == {"hidden": {"0": (mask[0] == 0).nonzero().flatten().tolist()}}
    loaded = load_pruned(tmp_path)
    assert loaded.config.hidden_size == int(mask.sum())
    assert unit_gates(loaded, "hidden").present()["hidden"].equal(mask.bool())
    expected = _logits(pruned, batch)
    assert (_logits(loaded, batch) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_joint_heads_neurons_and_channels_save_and_load(tmp_path):
    model, batch = tiny_llama(), lm_batch()
    gates = unit_gates(model, ["kv_group", "ffn", "hidden"])
    mask = {g: torch.ones(shape) for g, shape in gates.groups.items()}
    mask["dec_self"][1, 0] = 0
    mask["dec_ffn"][0, :20] = 0
    mask["hidden"] = _multiple_mask(32)
    _pruned_and_reloaded_equal_masked(model, gates, mask, batch, tmp_path)


@pytest.mark.parametrize("row", ["llama", "qwen2", "t5"])
def test_stock_transformers_loads_a_uniform_pruned_model(row, tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    make, batch_of = ROWS[row]
    model, batch = make(), batch_of()
    pruned, _ = _pruned(model, _multiple_mask(unit_gates(model, "hidden").groups["hidden"][1]))
    pruned.save_pretrained(tmp_path)
    stock = (AutoModelForSeq2SeqLM if row == "t5" else AutoModelForCausalLM).from_pretrained(tmp_path).eval()
    expected = _logits(pruned, batch)
    assert (_logits(stock, batch) - expected).abs().max() <= 1e-5 * expected.abs().max()


def test_kind_attributes_and_refusals(tmp_path):
    kind = KINDS["hidden"]
    assert (kind.parts, kind.noun, kind.config_fields, kind.floor_units) == (("residual",), "channel", ("hidden_size",), None)
    assert "one width" in kind.rearrangement and "one residual channel at a time" in kind.ablation
    model = tiny_llama()
    with pytest.raises(ValueError, match="at least one residual channel"):
        prune_unit_mask(unit_gates(model, "hidden"), {"hidden": torch.zeros(1, 32)})
    with pytest.raises(ValueError, match="channel"):
        unit_gates(model, "hidden").set_mask({"hidden": torch.ones(2, 32)})
    prune_unit_mask(unit_gates(model, "hidden"), {"hidden": _mask(32)})  # 18 channels: not a multiple of Llama's 4 heads
    with pytest.raises(ValueError, match="keep a multiple of 4 residual channels"):
        save_pruned(model, tmp_path)


def test_one_backward_scores_channels_with_the_other_kinds():
    from headprune.scoring.importance import importance_scores

    model, batch = tiny_llama(), lm_batch()
    unit = ["kv_group", "ffn", "hidden"]
    joint = importance_scores(model, unit_gates(model, unit), [batch], loss_fn=causal_lm_loss, unit=unit)
    alone = importance_scores(model, unit_gates(model, "hidden"), [batch], loss_fn=causal_lm_loss, unit="hidden")
    assert set(joint) == {"dec_self", "dec_ffn", "hidden"}
    assert torch.allclose(joint["hidden"], alone["hidden"], rtol=1e-5, atol=1e-6 * alone["hidden"].abs().max())


def test_prune_experiment_with_hidden_units_on_the_tiny_lm(capsys, monkeypatch, tmp_path):
    from cli_runs import TINY_LM_PRUNE, headprune

    run = tmp_path / "run"
    status, err = headprune(capsys, monkeypatch, tmp_path, run, *TINY_LM_PRUNE, "prune.unit=hidden", "prune.fractions=[0.5]")
    assert status == 0, err[-2000:]
    results = json.loads((run / "results.json").read_text())["results"]
    step = results["orders"]["importance"]["steps"][0]
    assert sum(step["mask"]["hidden"][0]) == 16 and step["score"] != results["base_score"]  # the masked model is evaluated


def test_layers_and_channels_removed_together_save_and_load(tmp_path):
    model, batch = tiny_llama(), lm_batch()
    gates = unit_gates(model, ["layer", "hidden"])
    mask = {g: torch.ones(shape) for g, shape in gates.groups.items()}
    layer_group = next(g for g in mask if g != "hidden")
    mask[layer_group][1] = 0
    mask["hidden"] = _multiple_mask(32)
    _pruned_and_reloaded_equal_masked(model, gates, mask, batch, tmp_path)
