"""Fine-tune recovery and the iterative schedule on a tiny random BERT with synthetic data (a few steps)."""

import copy

import pytest
import torch
from conftest import tiny_bert

from headprune.core.attention.gates import HeadGates
from headprune.core.inputs import model_inputs
from headprune.core.pruning import prune_heads, pruning_record
from headprune.lightning.finetune import RecoveryModule, distillation_loss, finetune_recover
from headprune.scoring.importance import per_example_loss
from headprune.selection.lsq import lsq_recoverer
from headprune.selection.schedule import iterative_prune


def _synthetic(n_batches=4, batch=8, length=10, seed=0):
    """Learnable synthetic classification: the label is the first token's id modulo 3."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for number in range(n_batches):
        ids = torch.randint(3, 100, (batch, length), generator=gen)
        idx = torch.arange(number * batch, (number + 1) * batch)  # a dataset key that is no model input
        out.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids[:, 0] % 3, "idx": idx})
    return out


def _mean_loss(model, batches):
    model.eval()
    with torch.no_grad():
        return float(torch.cat([per_example_loss(model(**model_inputs(model, b)), b) for b in batches]).mean())


def test_distillation_term_is_zero_when_student_is_teacher():
    logits = torch.randn(5, 3)
    assert float(distillation_loss(logits, logits.clone(), temperature=3.0)) == pytest.approx(0.0, abs=1e-7)
    assert float(distillation_loss(logits, torch.randn(5, 3), temperature=3.0)) > 0
    model = tiny_bert()
    module = RecoveryModule(model, teacher=copy.deepcopy(model), distill_weight=0.5)
    model.eval()
    task, distill, _ = module.losses(_synthetic(1)[0])
    assert float(distill) == pytest.approx(0.0, abs=1e-6) and float(task) > 0


def test_distillation_matches_the_definition_and_masks_padding_tokens():
    student, teacher = torch.randn(2, 4, 7), torch.randn(2, 4, 7)
    valid = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]]).bool()
    t = 2.0
    p = torch.softmax(teacher / t, -1)
    kl = (p * (p.log() - torch.log_softmax(student / t, -1))).sum(-1)
    torch.testing.assert_close(distillation_loss(student, teacher, t, valid), kl[valid].mean() * t * t)
    with pytest.raises(ValueError, match="temperature"):
        distillation_loss(student, teacher, 0.0)


def test_finetune_lowers_the_loss_and_pruned_heads_stay_pruned():
    model = tiny_bert()
    teacher = copy.deepcopy(model)
    prune_heads(model, {"enc_self": {0: [0, 1], 2: [0, 1, 2, 3]}})
    record = pruning_record(model)
    shapes = {k: v.shape for k, v in model.state_dict().items()}
    batches = _synthetic()
    before = _mean_loss(model, batches)
    history = finetune_recover(model, batches, teacher=teacher, distill_weight=0.3, max_steps=24, lr=3e-3, accelerator="cpu")
    assert len(history) == 24 and all(h["distill"] >= 0 for h in history)
    assert _mean_loss(model, batches) < before
    assert pruning_record(model) == record
    assert {k: v.shape for k, v in model.state_dict().items()} == shapes
    assert not model.training


def test_finetune_draws_its_dropout_from_its_seed_not_the_callers_stream():
    """The same fine-tune after different random draws gives the same weights (what a control or a saved recipe relies
    on); another seed gives other weights; the caller's random stream is left as it was."""

    def tuned(seed, draws):
        model = tiny_bert()  # BERT's dropout 0.1: the only randomness of a fine-tune on fixed batches
        torch.manual_seed(123)
        torch.rand(draws)  # what ran before (scoring, another point's fine-tune) moved the global stream
        state = torch.get_rng_state()
        finetune_recover(model, _synthetic(n_batches=2), max_steps=4, lr=3e-3, seed=seed, accelerator="cpu")
        assert torch.equal(torch.get_rng_state(), state)
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    first, after_other_draws, other_seed = tuned(0, 1), tuned(0, 1000), tuned(1, 1)
    torch.testing.assert_close(after_other_draws, first, rtol=0, atol=1e-6)
    assert float((other_seed - first).abs().max()) > 1e-3  # lr 3e-3 x 4 steps: another dropout moves the weights


def test_a_bf16_mixed_fine_tune_follows_the_fp32_one_and_keeps_fp32_weights():
    """bf16-mixed runs the matmuls in bfloat16 (8 bits of mantissa): its losses and weights track the fp32 fine-tune's within
    bfloat16's rounding, the weights stay fp32, and a precision Lightning's recovery does not offer is refused by name."""

    def tuned(precision):
        model = tiny_bert()
        for module in model.modules():
            if isinstance(module, torch.nn.Dropout):
                module.p = 0.0  # the two runs differ in arithmetic only
        history = finetune_recover(model, _synthetic(n_batches=2), max_steps=4, lr=1e-3, accelerator="cpu", precision=precision)
        return model, [h["loss"] for h in history]

    (full, full_losses), (mixed, mixed_losses) = tuned("32-true"), tuned("bf16-mixed")
    assert {p.dtype for p in mixed.parameters()} == {torch.float32}
    torch.testing.assert_close(torch.tensor(mixed_losses), torch.tensor(full_losses), rtol=3e-2, atol=0)
    moved = torch.cat([(a - b).flatten() for a, b in zip(full.parameters(), tiny_bert().parameters())]).norm()
    apart = torch.cat([(a - b).flatten() for a, b in zip(full.parameters(), mixed.parameters())]).norm()
    assert float(apart) < 0.2 * float(moved)  # Adam steps by about lr whatever the gradient: rounding flips the smallest ones
    with pytest.raises(ValueError, match="precision is one of 32-true, bf16-mixed"):
        finetune_recover(tiny_bert(), _synthetic(n_batches=1), max_steps=1, accelerator="cpu", precision="16-mixed")


def test_iterative_schedule_rescores_recovers_and_nests_masks():
    model = tiny_bert()
    batches = _synthetic(n_batches=2)
    steps = iterative_prune(model, [0.25, 0.5], batches, recover=lsq_recoverer())
    assert [s.fraction for s in steps] == [0.25, 0.5]
    removed = [int((s.mask["enc_self"] == 0).sum()) for s in steps]
    assert removed == [3, 6]
    assert torch.all(steps[1].mask["enc_self"] <= steps[0].mask["enc_self"])  # nested: pruned heads stay pruned
    for step in steps:
        present = HeadGates(step.model).present()["enc_self"]
        assert torch.equal(present, step.mask["enc_self"].bool())
    assert torch.all(steps[1].scores["enc_self"][steps[0].mask["enc_self"] == 0] == 0)  # re-scored on the pruned model


def test_iterative_schedule_with_finetune_recovery():
    model = tiny_bert()
    batches = _synthetic(n_batches=2)

    def recover(model, teacher, batches):
        finetune_recover(model, batches, teacher=teacher, distill_weight=0.5, max_steps=2, lr=1e-3, accelerator="cpu")

    steps = iterative_prune(model, [0.25, 0.5], batches, recover=recover, keep_models=False)
    assert [int((s.mask["enc_self"] == 0).sum()) for s in steps] == [3, 6] and steps[-1].model is None
    assert torch.equal(HeadGates(model).present()["enc_self"], steps[-1].mask["enc_self"].bool())
    with pytest.raises(ValueError, match="grow"):
        iterative_prune(model, [0.5, 0.25], batches)


def test_iterative_schedule_of_speedup_targets():
    from headprune.selection.costs import flops_cost_model

    model = tiny_bert()
    costs = flops_cost_model(model, seq_len=32)
    batches = _synthetic(n_batches=2)
    steps = iterative_prune(model, [{"speedup": 1.1}, {"speedup": 1.3}], batches, recover=lsq_recoverer(), costs=costs)
    speedups = [costs.speedup(s.mask) for s in steps]
    assert speedups[0] >= 1.1 and speedups[1] >= 1.3 and steps[1].target.value == 1.3
    assert torch.all(steps[1].mask["enc_self"] <= steps[0].mask["enc_self"])
    assert 0 < steps[0].fraction < steps[1].fraction
    with pytest.raises(ValueError, match="costs="):
        iterative_prune(model, [{"speedup": 1.5}], batches)


def test_seq2seq_distillation_counts_only_target_tokens():
    from conftest import seq2seq_batch, tiny_marian

    model = tiny_marian()
    module = RecoveryModule(model, teacher=copy.deepcopy(model), distill_weight=1.0)
    batch = seq2seq_batch()
    task, distill, _ = module.losses(batch)
    assert float(distill) == pytest.approx(0.0, abs=1e-6) and float(task) > 0.1
    with torch.no_grad():  # a clearly different teacher: its output layer scaled and shifted
        module.teacher.model.shared.weight.mul_(8.0)
        module.teacher.final_logits_bias.normal_(0.0, 3.0, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():  # teacher-forced logits as the module computes them (decoder inputs shifted from labels)
        student, teacher = (m(**model_inputs(m, batch)).logits for m in (model, module.teacher))
    valid = batch["labels"] != -100  # (B, T): the padded target positions must not count
    t = module.temperature
    log_p, log_q = (teacher / t).log_softmax(-1), (student / t).log_softmax(-1)
    expected = float((log_p.exp() * (log_p - log_q)).sum(-1)[valid].mean()) * t**2
    assert expected > 0.1  # far above float rounding: the check below compares two computations of it
    assert float(module.losses(batch)[1]) == pytest.approx(expected, rel=1e-4)


def test_distillation_loss_ignores_positions_outside_valid():
    gen = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(2, 5, 11, generator=gen), torch.randn(2, 5, 11, generator=gen)
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[1, 3:] = False
    far = teacher.clone()
    far[~valid] = 50.0 * torch.randn(int((~valid).sum()), 11, generator=gen)  # huge divergence where not valid
    assert float(distillation_loss(student, far, 1.0, valid)) == pytest.approx(
        float(distillation_loss(student, teacher, 1.0, valid)), rel=1e-5
    )
    assert float(distillation_loss(student, far, 1.0)) > 1.1 * float(distillation_loss(student, teacher, 1.0, valid))


def test_linear_warmup_decay_rises_then_falls_to_zero():
    from headprune.lightning.finetune import linear_warmup_decay

    factor = linear_warmup_decay(10, 0.2)
    values = [factor(t) for t in range(11)]
    assert values[:2] == [0.5, 1.0] and values[10] == 0.0
    assert all(a >= b for a, b in zip(values[1:], values[2:]))
    with pytest.raises(ValueError, match="warmup"):
        RecoveryModule(tiny_bert(), warmup=1.0, distill_weight=0.0)
