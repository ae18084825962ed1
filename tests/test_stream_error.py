"""tools/stream_error.py: each layer's stream error of a saved recovered point and its mask alone, token by token."""

import json

import pytest
from experiment_helpers import make_cfg, results


def test_stream_error_reads_a_saved_point_and_its_mask_alone(tmp_path):
    import stream_error

    from headprune.experiments import prune

    run = tmp_path / "run"
    cfg = make_cfg(
        run,
        "prune",
        "lm",
        "prune.unit=hidden",
        "prune.order=fisher",
        "prune.target={flops:0.8}",
        "prune.recover=[none,reconstruct]",
        "prune.recover_examples=8",
    )
    prune.run(cfg)
    points = results(run)["results"]["points"]
    assert points[-1]["units_removed"] > 0  # channels went: the kept ones are sliced out of the teacher's stream
    out = tmp_path / "stream.json"
    stream_error.main(["--run", str(run), "--point", "fisher+reconstruct@flops=0.8", "--out", str(out)])
    table = json.loads(out.read_text())
    layers = table["layers"]
    saved = json.loads((run / points[-1]["model_dir"] / "config.json").read_text())
    assert [row["layer"] for row in layers] == list(range(saved["num_hidden_layers"] + 1))  # the embedding, then each layer
    first = layers[0]  # the embedding's output: the mask keeps its channels exactly, whatever the recovery
    assert first["mask alone"]["ordinary_median"] < 1e-12 and first["fisher+reconstruct@flops=0.8"]["ordinary_median"] < 1e-12
    assert all(row[name]["tokens"] > 0 for row in layers for name in ("mask alone", "fisher+reconstruct@flops=0.8"))
    assert table["loss"]["unpruned"] > 0 and set(table["loss"]) == {"unpruned", "mask alone", "fisher+reconstruct@flops=0.8"}
    with pytest.raises(SystemExit, match="not a saved point"):  # the mask alone is not saved by default
        stream_error.main(["--run", str(run), "--point", "fisher@flops=0.8"])


def test_stream_error_refuses_a_point_that_removes_layers(tmp_path):
    import stream_error

    from headprune.experiments import prune

    run = tmp_path / "run"
    overrides = ("prune.unit=layer", "prune.order=fisher", "prune.target={flops:0.8}", "prune.recover=[reconstruct]")
    prune.run(make_cfg(run, "prune", "lm", *overrides, "prune.recover_examples=8"))
    with pytest.raises(SystemExit, match="removes layer units"):  # no stream left to compare at the removed layers
        stream_error.main(["--run", str(run), "--point", "fisher+reconstruct@flops=0.8"])
