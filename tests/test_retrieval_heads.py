"""The retrieval score (Wu et al. 2024): on attention built by hand, with the model's attention replaced by chosen peaks,
and the vectorised score against a slow loop over examples, steps and heads on the attention transformers returns."""

from __future__ import annotations

import pytest
import torch
from experiment_helpers import compose_cfg

from headprune.scoring.retrieval_heads import copy_hits, retrieval_scores

PASSKEY = [
    "experiment=inspect",
    "model=tiny_llama",
    "data=passkey_synthetic",
    "data.sizes.eval=4",
    "data.sizes.importance=6",
    "data.sizes.heldout=2",
    "data.sizes.train=0",
    "data.batch_size=4",
    "logger=none",
]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    from headprune.tasks.longctx.task import load_passkey_task

    torch.set_num_threads(1)
    return load_passkey_task(compose_cfg(tmp_path_factory.mktemp("retrieval"), PASSKEY))


def test_copy_hits_on_attention_built_by_hand():
    # one example of 6 positions: the needle holds tokens 7 8 at positions 2, 3; steps 4 and 5 produce 7 and 8
    input_ids = torch.tensor([[1, 5, 7, 8, 9, 7]])
    labels = torch.tensor([[-100, -100, -100, -100, 7, 8]])
    start = torch.tensor([[-1, -1, -1, -1, 2, 2]])
    end = torch.tensor([[-1, -1, -1, -1, 4, 4]])
    attention = torch.zeros(1, 4, 6, 6)
    peaks = {  # head: (peak of step 4, peak of step 5)
        0: (2, 3),  # copies both tokens from the needle: 2 hits
        1: (3, 2),  # peaks in the needle on the other token: none
        2: (5, 3),  # step 4 peaks on a 7 outside the needle (position 5), step 5 copies: 1 hit
        3: (0, 0),  # on the first token: none
    }
    for head, (a, b) in peaks.items():
        attention[0, head, 4, a] = 0.9
        attention[0, head, 5, b] = 0.9
    attention[0, :, :, 1] += 0.05  # mass elsewhere that is not the peak
    assert copy_hits(attention, input_ids, labels, start, end).tolist() == [[2.0, 0.0, 1.0, 0.0]]


def _copy_targets(batch: dict) -> dict[tuple[int, int], int]:
    """{(example, step): a needle position holding the token the step produces}."""
    out = {}
    for b, t in (batch["needle_start"] >= 0).nonzero().tolist():
        span = range(int(batch["needle_start"][b, t]), int(batch["needle_end"][b, t]))
        out[(b, t)] = next(j for j in span if batch["input_ids"][b, j] == batch["labels"][b, t])
    return out


def test_chosen_attention_peaks_give_the_expected_scores(task, monkeypatch):
    """The model's eager attention returns weights peaking where we say: head 0 of each layer on the copied needle token,
    head 1 on the first token, head 2 on the copied token in even examples only (elsewhere on the first token); head 3
    keeps its own attention."""
    import transformers.models.llama.modeling_llama as llama

    (batch,) = task.retrieval_batches(batch_size=len(task.data.split("importance")))
    targets = _copy_targets(batch)
    own = llama.eager_attention_forward

    def chosen(module, query, key, value, attention_mask, **kwargs):
        out, weights = own(module, query, key, value, attention_mask, **kwargs)
        weights = weights.clone()
        weights[:, :3] = 0.0
        weights[:, 1, :, 0] = 1.0
        for (b, t), j in targets.items():
            weights[b, 0, t, j] = 1.0
            weights[b, 2, t, j if b % 2 == 0 else 0] = 1.0
        return out, weights

    monkeypatch.setattr(llama, "eager_attention_forward", chosen)
    scores = retrieval_scores(task.model, task.gates, [batch])["dec_self"]
    examples = batch["input_ids"].shape[0]
    even = sum(1 for b in range(examples) if b % 2 == 0) / examples
    torch.testing.assert_close(scores[:, :3], torch.tensor([[1.0, 0.0, even]] * scores.shape[0]))
    assert task.model.config._attn_implementation == "headprune_sdpa"  # restored after the eager pass


def _slow_scores(model, batches) -> torch.Tensor:
    """The score by its definition: for each example, step and head, the argmax of the attention transformers returns."""
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    totals, examples = torch.zeros(layers, heads, dtype=torch.float64), 0
    for batch in batches:
        for b in range(batch["input_ids"].shape[0]):
            length = int(batch["attention_mask"][b].sum())
            with torch.no_grad():
                attentions = model(input_ids=batch["input_ids"][b : b + 1, :length], output_attentions=True).attentions
            steps = [t for t in range(length) if batch["needle_start"][b, t] >= 0]
            if not steps:
                continue
            examples += 1
            for layer in range(layers):
                for head in range(heads):
                    hits = 0
                    for t in steps:
                        j = int(attentions[layer][0, head, t, : t + 1].argmax())
                        inside = int(batch["needle_start"][b, t]) <= j < int(batch["needle_end"][b, t])
                        hits += inside and int(batch["input_ids"][b, j]) == int(batch["labels"][b, t])
                    totals[layer, head] += hits / len(steps)
    return (totals / examples).float()


def test_vectorised_score_equals_the_slow_loop_and_kv_groups_average_their_heads(task):
    import copy

    from headprune.core.units import unit_gates

    model = task.model
    eager = copy.deepcopy(model)
    eager.set_attn_implementation("eager")
    with torch.no_grad():  # peaked attention: a tenfold query scale, so that argmaxes are clear of float ties
        for layer in eager.model.layers:
            layer.self_attn.q_proj.weight.mul_(10.0)
    from headprune.core.attention.gates import HeadGates

    gates = HeadGates(eager)
    batches = task.retrieval_batches(batch_size=4)
    fast = retrieval_scores(eager, gates, batches)["dec_self"]
    slow = _slow_scores(eager, batches)
    torch.testing.assert_close(fast, slow, atol=1e-6, rtol=0)
    assert bool((slow > 0).any())  # some head copies some token: the comparison is not between zeros
    kv = retrieval_scores(eager, unit_gates(gates, "kv_group"), batches)["dec_self"]
    torch.testing.assert_close(kv, slow.view(slow.shape[0], -1, 2).mean(-1), atol=1e-6, rtol=0)


def test_batches_without_copy_spans_are_refused(task):
    batch = next(iter(task.importance_batches()))
    with pytest.raises(ValueError, match="needle_start"):
        retrieval_scores(task.model, task.gates, [batch])
