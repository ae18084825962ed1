"""Every decoder family of the table on a tiny random model: gates, per-example gates, importance, pruning, saving, FLOPs."""

import pytest
import torch
from tiny_llms import DECODER_CONFIGS, causal_lm_loss, lm_batch, tiny_family
from torch.utils.flop_counter import FlopCounterMode

from headprune.core.attention.gates import HeadGates
from headprune.core.checks import ConfigError
from headprune.core.counting import kv_cache_bytes_per_token, model_cost
from headprune.core.masks import kv_to_head_mask
from headprune.core.pruning import prune_kv_groups, prune_mask, pruning_record
from headprune.core.saving import load_pruned, save_pruned
from headprune.scoring.importance import importance_scores, per_example_gate_gradients

PRUNABLE = [t for t in DECODER_CONFIGS if t != "olmo2"]  # OLMo 2 normalises across heads: gates only
GROUPED = ["phi3", "gemma2", "gemma3_text", "olmo2", "granite"]  # 4 query heads over 2 KV heads
ATTENTION = {"gemma2": ["eager"]}  # Gemma 2's soft-capping has no sdpa path in transformers
UNEVEN = torch.tensor([[1, 0, 1, 1], [0, 0, 0, 0], [0, 1, 0, 0]]).float()  # 3, 0 (emptied) and 1 heads


def _cases(types):
    return [(t, attn) for t in types for attn in ATTENTION.get(t, ["sdpa", "eager"])]


def _logits(model, batch):
    with torch.no_grad():
        return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits


def _close(actual, expected, rel=1e-5):
    """Equal within ``rel`` of the output scale."""
    torch.testing.assert_close(actual, expected, atol=rel * float(expected.abs().max()), rtol=0)


def _masks():
    gen = torch.Generator().manual_seed(3)
    return [UNEVEN] + [(torch.rand(3, 4, generator=gen) > 0.5).float() for _ in range(2)]


@pytest.mark.parametrize("model_type,attn", _cases(PRUNABLE))
def test_pruned_equals_masked_and_survives_save_load(tmp_path, model_type, attn):
    model = tiny_family(model_type, attn=attn)
    gates = HeadGates(model)
    batch = lm_batch()
    plain = _logits(model, batch)
    for number, mask in enumerate(_masks()):
        with gates.masked({"dec_self": mask}):
            masked = _logits(model, batch)
        assert (masked - plain).abs().max() > 1e-3 * plain.abs().max()  # the mask changes the output
        pruned = tiny_family(model_type, attn=attn)  # never gated: pruning alone must make it run
        prune_mask(pruned, {"dec_self": mask})
        _close(_logits(pruned, batch), masked)
        save_pruned(pruned, tmp_path / f"m{number}")
        reloaded = load_pruned(tmp_path / f"m{number}")
        _close(_logits(reloaded, batch), masked)
        assert pruning_record(reloaded) == pruning_record(pruned)


@pytest.mark.parametrize("model_type", PRUNABLE)
def test_greedy_generation_with_cache_pruned_equals_gated(model_type):
    model = tiny_family(model_type, attn=ATTENTION.get(model_type, ["sdpa"])[0])
    gates = HeadGates(model)
    batch = lm_batch(left_pad=True)
    kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], max_new_tokens=5, do_sample=False, pad_token_id=0)
    with gates.masked({"dec_self": UNEVEN}):
        gated = model.generate(**kwargs)
    pruned = tiny_family(model_type, attn=ATTENTION.get(model_type, ["sdpa"])[0])
    prune_mask(pruned, {"dec_self": UNEVEN})
    assert torch.equal(pruned.generate(**kwargs), gated)


@pytest.mark.parametrize("model_type", [t for t in GROUPED if t != "olmo2"])
def test_kv_groups_pruned_equal_masked(model_type):
    model = tiny_family(model_type, attn="eager")
    gates = HeadGates(model)
    assert gates.kv_groups == {"dec_self": (3, 2)}
    kv_mask = {"dec_self": torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])}
    with gates.masked(kv_to_head_mask(kv_mask, gates.heads_per_kv)):
        masked = _logits(model, lm_batch())
    prune_kv_groups(model, {"dec_self": {0: [1], 1: [0, 1], 2: [0]}})
    _close(_logits(model, lm_batch()), masked)
    assert [len(s.kv_ids) for s in gates.sites] == [1, 0, 1]
    head_dim = gates.sites[0].head_dim
    assert kv_cache_bytes_per_token(model) == 2 * 3 * head_dim * 4  # one KV head per layer (the emptied one: its phantom)


@pytest.mark.parametrize("model_type,attn", _cases(DECODER_CONFIGS))
def test_per_example_gates_equal_one_mask_at_a_time(model_type, attn):
    model = tiny_family(model_type, attn=attn)
    gates = HeadGates(model)
    batch = lm_batch(batch=3)
    per_example = torch.stack(_masks())  # (B, L, H): example b under mask b
    with gates.masked({"dec_self": per_example}):
        together = _logits(model, batch)
    for row in range(3):
        single = {k: v[row : row + 1] for k, v in batch.items()}
        with gates.masked({"dec_self": per_example[row]}):
            _close(together[row : row + 1], _logits(model, single))


@pytest.mark.parametrize("model_type", list(DECODER_CONFIGS))
def test_importance_from_one_backward_equals_explicit_gates_and_the_example_loop(model_type):
    model = tiny_family(model_type, attn=ATTENTION.get(model_type, ["sdpa"])[0])
    gates = HeadGates(model)
    batch = lm_batch(batch=3)
    probed = per_example_gate_gradients(model, gates, batch, loss_fn=causal_lm_loss)["dec_self"]  # (B, L, H)
    gate = torch.ones(3, 3, 4, requires_grad=True)  # an explicit gate per example, layer and head
    with gates.masked({"dec_self": gate}), torch.enable_grad():
        causal_lm_loss(model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]), batch).sum().backward()
    scale = float(gate.grad.abs().max())
    torch.testing.assert_close(probed.float(), gate.grad, atol=1e-5 * scale, rtol=0)
    for row in range(3):  # one example at a time
        single = {k: v[row : row + 1] for k, v in batch.items()}
        alone = per_example_gate_gradients(model, gates, single, loss_fn=causal_lm_loss)["dec_self"][0]
        torch.testing.assert_close(probed[row], alone, atol=1e-5 * scale, rtol=0)
    scores = importance_scores(model, gates, [batch], loss_fn=causal_lm_loss, normalize_layers=False)["dec_self"]
    torch.testing.assert_close(scores.double(), probed.abs().mean(0), atol=1e-5 * scale, rtol=0)


@pytest.mark.parametrize("model_type", PRUNABLE)
def test_flops_counted_equal_a_flop_counter(model_type):
    model = tiny_family(model_type, attn="eager")
    prune_mask(model, {"dec_self": UNEVEN})
    tokens = 12
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(input_ids=torch.randint(3, 64, (1, tokens)))
    assert model_cost(model, seq_len=tokens).flops == counter.get_total_flops()
    assert model_cost(model).heads == 4


def test_olmo2_pruning_is_refused_with_the_reason():
    model = tiny_family("olmo2")
    with pytest.raises(ConfigError, match=r"normalises all heads together.*cannot equal the masked one.*use masks"):
        prune_mask(model, {"dec_self": UNEVEN})
    prune_mask(model, {"dec_self": torch.ones(3, 4)})  # removing nothing is allowed


def test_family_shapes_read_from_the_model():
    heads = {t: HeadGates(tiny_family(t, attn=ATTENTION.get(t, ["sdpa"])[0])) for t in DECODER_CONFIGS}
    assert all(g.groups == {"dec_self": (3, 4)} for g in heads.values())
    assert {t for t, g in heads.items() if g.kv_groups["dec_self"][1] == 2} == set(GROUPED)
    assert heads["gemma2"].sites[0].head_dim == 16  # head_dim apart from hidden / heads


@pytest.mark.parametrize("model_type", list(DECODER_CONFIGS))
def test_batched_ablation_equals_one_mask_at_a_time(model_type):
    from mask_references import looped_nll

    from headprune.engine.ablation import single_unit_masks
    from headprune.engine.ablation_causal import CausalMaskBatcher

    model = tiny_family(model_type, attn=ATTENTION.get(model_type, ["sdpa"])[0])
    gates = HeadGates(model)
    batch = lm_batch(seed=1, batch=4, length=10)
    batch["labels"] = torch.cat([batch["labels"][:, 1:], torch.full((4, 1), -100)], 1)  # next-token labels
    masks, _ = single_unit_masks(gates.groups)
    masks = masks + [{"dec_self": UNEVEN}, None]
    batched = CausalMaskBatcher(model, gates, max_tokens=60, head_tokens=7, pass_tokens=4).nll(batch, masks)
    looped = looped_nll(model, gates, batch, masks)
    torch.testing.assert_close(batched, looped, atol=1e-5 * float(looped.abs().max()), rtol=0)


@pytest.mark.parametrize("model_type", ["gemma2", "granite", "gpt2"])
def test_output_logits_from_hidden_states_equal_the_forward(model_type):
    from headprune.engine.ablation_causal import output_logits

    model = tiny_family(model_type, attn=ATTENTION.get(model_type, ["sdpa"])[0])
    batch = lm_batch()
    with torch.no_grad():
        hidden = model.base_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
        _close(output_logits(model)(hidden), _logits(model, batch))


@pytest.mark.parametrize("model_type", PRUNABLE)
def test_least_squares_recovery_masked_twin_equals_pruned_twin(model_type):
    import copy

    from headprune.selection.lsq import lsq_recover

    model = tiny_family(model_type, attn=ATTENTION.get(model_type, ["sdpa"])[0])
    gates = HeadGates(model)
    batches = [lm_batch(seed=s, batch=4, length=10) for s in range(2)]
    mask = {"dec_self": UNEVEN}
    teacher, pruned = copy.deepcopy(model), copy.deepcopy(model)
    prune_mask(pruned, mask)
    masked_scales = lsq_recover(model, gates, batches, mask=mask, shrinks=(1.0,))["dec_self"]  # the plain least squares
    pruned_scales = lsq_recover(pruned, HeadGates(pruned), batches, teacher=teacher, shrinks=(1.0,))["dec_self"]
    torch.testing.assert_close(masked_scales, pruned_scales, atol=1e-4, rtol=1e-4)
    assert (masked_scales[UNEVEN.bool()] - 1).abs().max() > 1e-3  # the kept heads were rescaled
    with gates.masked(mask):
        _close(_logits(pruned, batches[0]), _logits(model, batches[0]), rel=1e-4)


def _falcon(**variant):
    """A tiny Falcon of another layout: classic multi-head (q/k/v per head), grouped KV (new decoder architecture), ALiBi."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    config = AutoConfig.for_model("falcon", **{**DECODER_CONFIGS["falcon"], **variant})
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()


@pytest.mark.parametrize("variant", [dict(multi_query=False), dict(new_decoder_architecture=True, num_kv_heads=2)])
def test_falcon_layouts_pruned_equal_masked(variant):
    model = _falcon(**variant)
    gates = HeadGates(model)
    grouped = variant.get("num_kv_heads") == 2
    mask = (
        kv_to_head_mask({"dec_self": torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 1.0]])}, {"dec_self": 2})["dec_self"]
        if grouped
        else UNEVEN
    )
    with gates.masked({"dec_self": mask}):
        masked = _logits(model, lm_batch())
    pruned = _falcon(**variant)
    prune_mask(pruned, {"dec_self": mask})
    _close(_logits(pruned, lm_batch()), masked)
    if grouped:  # its grouped layout cannot run unequal groups: refused, naming the way that works
        with pytest.raises(ConfigError, match=r"as many query heads for every KV head.*prune.unit=kv_group"):
            prune_mask(_falcon(**variant), {"dec_self": UNEVEN})


def test_falcon_with_alibi_gates_but_refuses_pruning():
    model = _falcon(alibi=True)
    gates = HeadGates(model)
    with gates.masked({"dec_self": UNEVEN}):
        masked = _logits(model, lm_batch())
    assert (masked - _logits(model, lm_batch())).abs().max() > 1e-4
    with pytest.raises(ConfigError, match=r"alibi=True cannot be pruned physically.*ALiBi"):
        prune_mask(model, {"dec_self": UNEVEN})


def test_a_deep_copy_of_a_model_gated_at_the_output_projection_has_gates_of_its_own():
    import copy

    model = tiny_family("falcon")
    gates = HeadGates(model)
    twin = copy.deepcopy(model)
    batch = lm_batch()
    plain = _logits(twin, batch)
    with gates.masked({"dec_self": UNEVEN}):
        torch.testing.assert_close(_logits(twin, batch), plain, atol=0, rtol=0)  # the original's mask leaves the copy alone
    with HeadGates(twin).masked({"dec_self": UNEVEN}):
        masked = _logits(twin, batch)
    with gates.masked({"dec_self": UNEVEN}):
        _close(masked, _logits(model, batch))


@pytest.mark.parametrize("model_type", list(DECODER_CONFIGS))
def test_config_checks_read_the_head_counts_the_model_has(model_type):
    from headprune.core.attention.kind import kv_heads_in_fields
    from headprune.core.unit_kinds import KINDS

    model = tiny_family(model_type, attn=ATTENTION.get(model_type, ["sdpa"])[0])
    gates = HeadGates(model)
    fields = model.config.to_dict()
    assert KINDS["head"].units_per_layer(fields) == gates.groups["dec_self"][1]
    assert (kv_heads_in_fields(fields) or gates.groups["dec_self"][1]) == gates.kv_groups["dec_self"][1]
