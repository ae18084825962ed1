"""NLI on DistilBERT and DeBERTa-v2, MT on T5 (tiny random models, synthetic data): the experiments run unchanged."""

from __future__ import annotations

import pytest
from experiment_helpers import FAST, MT, NLI, compose_cfg, results

from headprune.experiments import ablate, prune, speed


def _cfg(tmp_path, model: str, experiment: str, *overrides, task: list[str] = NLI):
    base = [f"model={model}" if o.startswith("model=") else o for o in task]
    extra = [o for o in FAST if o.split("=")[0].split(".")[0] in ("logger", experiment)]
    return compose_cfg(tmp_path, [f"experiment={experiment}", *base, "device=cpu", *extra, *overrides])


@pytest.mark.parametrize("model", ["tiny_distilbert", "tiny_deberta_v2"])
def test_nli_ablate_prune_and_speed(model, tmp_path):
    ablate.run(_cfg(tmp_path / "a", model, "ablate"))
    rows = results(tmp_path / "a")["results"]["splits"]["eval"]["rows"]
    assert len(rows) == 2 * 4  # 2 layers x 4 heads
    prune.run(_cfg(tmp_path / "p", model, "prune", "prune.fractions=[0.5]"))
    speed_overrides = ["speed.batch_sizes=[2]", "speed.examples=4", "speed.repeats=2", "speed.warmup=1"]
    speed.run(_cfg(tmp_path / "s", model, "speed", f"speed.mask_file={tmp_path / 'p' / 'results.json'}", *speed_overrides))
    res = results(tmp_path / "s")["results"]
    assert res["score_check"]["equal"] and res["units_removed"] == 4


def test_min_heads_check_reads_distilbert_head_count(tmp_path):
    from headprune.core.checks import ConfigError
    from headprune.validation import validate

    with pytest.raises(ConfigError, match="at most 3"):
        validate(_cfg(tmp_path, "tiny_distilbert", "prune", "prune.min_units_per_layer=4"))  # n_heads: 4


def test_mt_prune_on_t5(tmp_path):
    """T5 (trained tokenizer, start token = pad) through the MT task: importance order, pruned at 0 and 50%."""
    prune.run(_cfg(tmp_path, "tiny_t5", "prune", "prune.fractions=[0,0.5]", task=MT))
    res = results(tmp_path)["results"]
    assert res["groups"] == ["enc_self", "enc_dec", "dec_self"] and res["units_total"] == 3 * 2 * 4
    assert [step["units_removed"] for step in res["orders"]["importance"]["steps"]] == [0, 12]


def test_mt_source_prefix_goes_before_every_source(tmp_path):
    """``data.source_prefix`` (T5's task prefix) is tokenized in front of each source sentence; targets are unchanged."""
    from headprune.core.checks import ConfigError
    from headprune.models.tokenizers import encode
    from headprune.tasks import registry
    from headprune.validation import validate

    prefix = "translate English to German: "
    cfg = _cfg(tmp_path, "tiny_t5", "ablate", f"data.source_prefix='{prefix}'", task=MT)
    validate(cfg)
    data = registry.load_task(cfg).data
    texts, targets = data.split_texts("valid")
    sources, labels = data.split_encoded("valid")
    assert sources == encode(data.build_tokenizer(), [prefix + line for line in texts])
    assert labels == encode(data.build_tokenizer(), targets, target=True)
    with pytest.raises(ConfigError, match="data.source_prefix"):
        validate(_cfg(tmp_path, "tiny_t5", "ablate", "data.source_prefix=5", task=MT))


@pytest.mark.parametrize(
    "model,task,groups",
    [
        ("tiny_distilbert", NLI, {"enc_self": [2, 4]}),
        ("tiny_deberta_v2", NLI, {"enc_self": [2, 4]}),
        ("tiny_t5", MT, {"enc_self": [2, 4], "enc_dec": [2, 4], "dec_self": [2, 4]}),
    ],
)
def test_inspect_shows_the_family(model, task, groups, tmp_path, capsys):
    from headprune.experiments import inspect

    numbers = inspect.run(_cfg(tmp_path, model, "inspect", task=task))
    assert numbers["groups"] == groups and f"heads present: {sum(l * h for l, h in groups.values())} of" in capsys.readouterr().out
