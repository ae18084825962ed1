"""The vocab kind's scores on the loss scale: freq(t) x mean loss per token, smoothed by a Zipf prior over the ids."""

from __future__ import annotations

import pytest
import torch
from experiment_helpers import make_cfg


@pytest.fixture(scope="module")
def lm_task(tmp_path_factory):
    torch.set_num_threads(1)
    from headprune.tasks import registry

    return registry.load_task(make_cfg(tmp_path_factory.mktemp("task"), "prune", "lm", "data.tokenizer.vocab_size=400"))


def _settings(task):
    from omegaconf import OmegaConf

    from headprune.sources.orders import OrderSettings

    importance = OmegaConf.create({"reduce": "example", "normalize_layers": False, "normalize_global": False})
    return OrderSettings(importance=importance, seed=0, ablation_split=None, n_samples=None)


def _counts_and_loss(task):
    """Each token's uses in the importance batches' inputs, and the mean per-example loss, from the plain model."""
    from headprune.core.inputs import model_inputs
    from headprune.scoring.importance import per_example_loss

    size = task.model.get_input_embeddings().num_embeddings
    counts, losses = torch.zeros(size, dtype=torch.float64), []
    with torch.no_grad():
        for batch in task.importance_batches():
            counts += torch.bincount(batch["input_ids"].flatten(), minlength=size).double()
            losses.append(per_example_loss(task.model(**model_inputs(task.model, batch)), batch).double())
    return counts, float(torch.cat(losses).mean())


def _expected(task, counts, mean_loss):
    """freq x mean loss with the prior written out: n1 uses shared as 1 / rank over the non-special ids, each w / (1 + w)."""
    config = task.model.config
    special = {getattr(config, f, None) for f in ("pad_token_id", "bos_token_id", "eos_token_id", "unk_token_id")} - {None}
    plain = [i for i in range(len(counts)) if i not in special]
    harmonic = sum(1.0 / r for r in range(1, len(plain) + 1))
    singletons = max(sum(1 for i in plain if counts[i] == 1), 1)
    smoothed = counts.clone()
    for rank, i in enumerate(plain, start=1):
        w = singletons / (rank * harmonic)
        smoothed[i] += w / (1 + w)
    return smoothed / sum(float(smoothed[i]) for i in plain) * mean_loss, plain


@pytest.mark.parametrize("order", ["fisher", "importance"])
def test_joint_vocab_scores_are_freq_times_mean_loss_plus_prior(lm_task, order):
    from headprune.sources.orders import ORDERS
    from headprune.tasks.unit_task import in_unit

    task = in_unit(lm_task, "kv_group+ffn+vocab")
    scores = ORDERS[order].scores(task, _settings(task))["vocab"][0].double()
    counts, mean_loss = _counts_and_loss(task)
    expected, plain = _expected(task, counts, mean_loss)
    assert torch.allclose(scores[plain], expected[plain], rtol=1e-5, atol=0)
    unseen = [i for i in plain if counts[i] == 0]
    assert unseen and bool((scores[unseen] > 0).all())  # a token the importance text never uses is not free
    assert float(scores[plain].sum()) == pytest.approx(mean_loss, rel=1e-5)  # removing every token: about one mean loss per token


def test_vocab_only_ranking_is_unchanged_by_the_loss_scale(lm_task):
    """The merge-closed ranking of the loss-scale scores equals that of the raw counts (ties by id), so every cut keeps the same tokens."""
    from headprune.sources.orders import ORDERS, with_floor
    from headprune.tasks.unit_task import in_unit

    task = in_unit(lm_task, "vocab")
    new = with_floor(task, ORDERS["fisher"].scores(task, _settings(task)))["vocab"][0]
    counts, _ = _counts_and_loss(task)
    old = with_floor(task, {"vocab": counts.float().unsqueeze(0)})["vocab"][0]  # the count scores as they were
    finite = int(old.isfinite().sum())
    assert 0 < finite < len(old)
    order_new = sorted(range(len(new)), key=lambda i: (float(new[i]), -i))
    order_old = sorted(range(len(old)), key=lambda i: (float(old[i]), -i))
    assert order_new == order_old
    for cut in (1, finite // 3, finite // 2, finite):  # the kept set of each cut, by the scores alone
        assert set(new.argsort(stable=True)[cut:].tolist()) == set(old.argsort(stable=True)[cut:].tolist())
