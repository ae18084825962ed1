"""Save and load physically pruned models: HF ``save_pretrained`` files plus the pruning record."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from headprune.heads import find_sites
from headprune.pruning import RECORD_ATTR, prune_heads, pruning_record

RECORD_FILE = "headprune_pruning.json"


def save_pruned(model: nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Write the model (HF format), its tokenizer and ``headprune_pruning.json`` to ``path``."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    record = pruning_record(model)
    setattr(model.config, RECORD_ATTR, record)
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    heads = {f"{s.group}.{s.layer}": len(s.head_ids) for s in find_sites(model)}
    meta = {"model_type": model.config.model_type, "architecture": type(model).__name__, "pruned_heads": record, "heads_present": heads}
    (path / RECORD_FILE).write_text(json.dumps(meta, indent=1))
    return path


def _state_dict_from(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if files:
        state = {}
        for file in files:
            state.update(load_file(str(file)))
        return state
    bin_file = path / "pytorch_model.bin"
    if bin_file.exists():
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise FileNotFoundError(f"no weights (*.safetensors or pytorch_model.bin) in {path}")


def load_pruned(path: str | Path, model_class=None, **config_overrides) -> nn.Module:
    """Load a model saved by ``save_pruned`` (or any HF model dir), rebuilding the uneven head counts."""
    from transformers import AutoConfig

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} holds no config.json: is it a directory written by save_pruned/save_pretrained?")
    config = AutoConfig.from_pretrained(path, **config_overrides)
    if model_class is None:
        import transformers

        model_class = getattr(transformers, config.architectures[0])
    record = getattr(config, RECORD_ATTR, None) or {}
    meta_file = path / RECORD_FILE
    if meta_file.exists():
        meta = json.loads(meta_file.read_text())
        if meta["pruned_heads"] != record:
            raise ValueError(f"{meta_file} and config.json disagree on the pruned heads: {meta['pruned_heads']} vs {record}")
    model = model_class._from_config(config)
    try:
        prune_heads(model, record)
    except (IndexError, ValueError) as err:
        raise ValueError(f"the pruning record in {path} does not match a {config.model_type} model with this config: {err}") from err
    state = _state_dict_from(path)
    expected = model.state_dict()
    wrong = [k for k, v in state.items() if k in expected and expected[k].shape != v.shape]
    if wrong:
        k = wrong[0]
        raise ValueError(
            f"the pruning record in {path} does not match its weights: {k} has shape {tuple(state[k].shape)} "
            f"in the file but {tuple(expected[k].shape)} after pruning {record} ({len(wrong)} tensors differ)"
        )
    missing, _ = model.load_state_dict(state, strict=False)
    model.tie_weights()
    tied = {name for name, p in model.named_parameters(remove_duplicate=False) if any(p is q for n, q in model.named_parameters() if n in state)}
    left = [k for k in missing if k not in tied and not k.endswith("embed_positions.weight")]
    if left:
        raise ValueError(f"weights missing from {path}: {left[:5]}")
    return model.eval()
