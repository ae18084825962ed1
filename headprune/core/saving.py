"""Save and load physically pruned models: HF ``save_pretrained`` files plus the pruning record."""

import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from headprune.core.kinds import KINDS, UnitKind
from headprune.core.record_digests import RECORD_FILE

FORMAT = 2  # 2: each kind's entries under {"kinds": {name: ...}}; 1 (no "format"): the built-in kinds' entries at the top level


def saving_kinds() -> list[UnitKind]:
    """The registered kinds in the order they save and rebuild (``rebuild_order``: depth first, then widths)."""
    return sorted(KINDS.values(), key=lambda kind: kind.rebuild_order)  # stable: registry order within one rank


def save_pruned(model: nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Write the model (HF format), its tokenizer and ``headprune_pruning.json`` (each kind's ``save_meta``) to ``path``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"save_pruned takes a directory to write the model into; {path} is a file: give a new or existing directory")
    path.mkdir(parents=True, exist_ok=True)
    # each kind's entries before save_pretrained: a kind may bring the config up to date
    kinds = {kind.name: entry for kind in saving_kinds() if (entry := kind.save_meta(model)) is not None}
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    for kind in saving_kinds():
        kind.finish_save(model, path, tokenizer)
    meta = {"model_type": model.config.model_type, "architecture": type(model).__name__, "format": FORMAT, "kinds": kinds}
    (path / RECORD_FILE).write_text(json.dumps(meta, indent=1))
    return path


def _state_dict_from(path: Path) -> dict[str, torch.Tensor]:
    """The weights of a model directory (its *.safetensors, else pytorch_model.bin); a ValueError naming a damaged file."""
    files = sorted(path.glob("*.safetensors")) or [path / "pytorch_model.bin"]
    if not files[0].exists():
        raise FileNotFoundError(f"no weights (*.safetensors or pytorch_model.bin) in {path}")
    state = {}
    for file in files:
        try:
            state.update(load_file(str(file)) if file.suffix == ".safetensors" else torch.load(file, map_location="cpu", weights_only=True))
        except Exception as err:  # noqa: BLE001 - safetensors and torch raise their own types for a damaged file
            raise ValueError(
                f"{file} cannot be read as weights ({type(err).__name__}: {err}): the file is damaged or truncated; save the model again"
            ) from None
    return state


def _model_dir(path) -> Path:
    """``path`` as the directory of a saved model; a TypeError, ValueError or FileNotFoundError saying what to give instead."""
    wanted = "the directory save_pruned (or save_pretrained) wrote"
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"load_pruned takes {wanted}, as a str or Path; got {type(path).__name__} {path!r:.60}")
    if not str(path).strip():
        raise ValueError(f"load_pruned got an empty path: give {wanted}")
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist ({path.resolve()}): give {wanted}")
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is a file: give {wanted} (the folder that holds config.json and the weights)")
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} holds no config.json: is it a directory written by save_pruned/save_pretrained?")
    return path


def _refuse_unsupported_type(config_file: Path) -> None:
    """A ValueError naming the model type of a readable config.json that no family covers (else nothing)."""
    from headprune.core.families import supported_model_types

    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return  # unreadable: the caller says the file is damaged
    if model_type not in supported_model_types():
        raise ValueError(
            f"{config_file} says model_type={model_type!r}, which headprune does not support: the supported model types "
            f"are {', '.join(supported_model_types())} (headprune/core/families.py)"
        ) from None


def load_pruned(path: str | Path, model_class=None, **config_overrides) -> nn.Module:
    """Load a model saved by ``save_pruned`` (or any HF model dir), rebuilding the uneven head counts."""
    from transformers import AutoConfig

    path = _model_dir(path)
    try:
        config = AutoConfig.from_pretrained(path, **config_overrides)
    except (OSError, ValueError) as err:
        _refuse_unsupported_type(path / "config.json")
        raise ValueError(f"{path / 'config.json'} cannot be read ({err}): the file is damaged or truncated; save the model again") from None
    if model_class is None:
        import transformers

        model_class = getattr(transformers, config.architectures[0])
    meta_file = path / RECORD_FILE
    entries = None
    if meta_file.exists():
        try:
            meta = json.loads(meta_file.read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{meta_file} is not valid JSON ({err}): the file is damaged or truncated; save the model again") from None
        if "kinds" not in meta:  # format 1: the built-in kinds' entries at the top level
            meta["kinds"] = {kind.name: {k: meta[k] for k in kind.legacy_keys if k in meta} for kind in KINDS.values() if kind.legacy_keys}
        unknown = [name for name in meta["kinds"] if name not in KINDS]
        if unknown:
            raise ValueError(
                f"{meta_file} holds units of the kinds {unknown}, which are not registered: "
                "register them (register_kind) before load_pruned"
            )
        entries = meta["kinds"]  # {kind name: its entries}
    kinds = saving_kinds()
    for kind in kinds:
        kind.build_config(config)  # the hidden kind builds at the original residual width, then slices
    model = model_class._from_config(config)
    for kind in kinds:  # depth first: heads and FFN widths are recorded by original layer id
        kind.restore(model, None if entries is None else entries.get(kind.name, {}), path)
    expected = model.state_dict()
    state = _in_model_names(model, _state_dict_from(path), expected)
    for key, value in state.items():  # v4 stores a layer with no heads left as 0-row q/k/v, 0-column output weights
        target = expected.get(key)
        if target is not None and target.shape != value.shape and not value.numel() and value.dim() == target.dim():
            state[key] = value.new_zeros(target.shape)  # our zero phantom head
    wrong = [k for k, v in state.items() if k in expected and expected[k].shape != v.shape]
    if wrong:
        k = wrong[0]
        raise ValueError(
            f"the pruning record in {path} does not match its weights: {k} has shape {tuple(state[k].shape)} "
            f"in the file but {tuple(expected[k].shape)} after rebuilding its record ({len(wrong)} tensors differ)"
        )
    missing, _ = model.load_state_dict(state, strict=False)
    for kind in kinds:
        kind.verify(model, None if entries is None else entries.get(kind.name, {}), path)
    model.tie_weights()
    tied = {
        name for name, p in model.named_parameters(remove_duplicate=False) if any(p is q for n, q in model.named_parameters() if n in state)
    }
    left = [k for k in missing if k not in tied and not k.endswith("embed_positions.weight")]
    if left:
        raise ValueError(f"weights missing from {path}: {left[:5]}")
    return model.eval()


def _in_model_names(model: nn.Module, state: dict[str, torch.Tensor], expected: dict) -> dict[str, torch.Tensor]:
    """The file's weights under the model's names (transformers writes ViT, DeiT in an older layout, GPT-NeoX's lm_head as embed_out)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, apply_renamings, revert_weight_conversion

    by_tensor = {id(tensor): name for name, tensor in expected.items()}
    renamed = {saved: by_tensor.get(id(tensor)) for saved, tensor in revert_weight_conversion(model, dict(expected)).items()}
    state = {renamed.get(name) or name: tensor for name, tensor in state.items()}  # renames only; other conversions stay as saved
    if all(key in expected for key in state):
        return state
    renamings = [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]
    return {key if key in expected else apply_renamings(key, renamings): value for key, value in state.items()}
