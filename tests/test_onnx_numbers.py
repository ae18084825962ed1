"""tools/onnx_numbers.py loads a prune run's saved point wherever its directory is named, and records what it keeps."""

from __future__ import annotations

import torch
from experiment_helpers import NLI, compose_cfg


def test_a_target_point_directory_loads_with_its_uneven_ffn_widths(tmp_path, monkeypatch):
    """A target's point directory holds '=' (fisher+finetune@speedup=1.3), which a Hydra override cannot carry."""
    import onnx_numbers

    from headprune.core.ffn.sites import find_ffn_sites
    from headprune.core.saving import save_pruned
    from headprune.core.units import prune_unit_mask, unit_gates
    from headprune.tasks.registry import load_task

    monkeypatch.setenv("HEADPRUNE_DATA_DIR", str(tmp_path / "data"))
    task = load_task(compose_cfg(tmp_path, ["experiment=ablate", *NLI]))
    widths = [site.width for site in find_ffn_sites(task.model)]
    mask = {"enc_ffn": torch.ones(len(widths), max(widths))}
    mask["enc_ffn"][0, :5] = 0  # uneven: 5 neurons gone from the first layer, the last emptied
    mask["enc_ffn"][-1] = 0
    gates = unit_gates(task.model, "ffn")
    prune_unit_mask(gates, mask)
    gates.remove()
    folder = tmp_path / "models" / "fisher+finetune@speedup=1.3"
    save_pruned(task.model, folder, tokenizer=task.tokenizer)

    loaded = onnx_numbers.load(str(folder), "nli_synthetic", 8, "tiny_bert")
    assert [site.width for site in find_ffn_sites(loaded.model)] == [widths[0] - 5, *widths[1:-1], 0]
    for name, tensor in task.model.state_dict().items():
        torch.testing.assert_close(loaded.model.state_dict()[name], tensor, rtol=0, atol=0)
