"""Save and load physically pruned models: HF ``save_pretrained`` files plus the pruning record."""

import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch import nn

from headprune.core.families import family_for
from headprune.core.ffn_saving import DIGESTS as FFN_DIGESTS
from headprune.core.ffn_saving import ffn_digest, ffn_meta, rebuild_ffn
from headprune.core.ffn_sites import ffn_sites_if_any
from headprune.core.gates import AttentionSite, find_sites
from headprune.core.hidden_pruning import build_width, hidden_meta, rebuild_hidden
from headprune.core.layer_removal import REMOVED_ATTR, restore_layer_ids
from headprune.core.pruning import RECORD_ATTR, prune_heads, pruning_record

RECORD_FILE = "headprune_pruning.json"
V4_ATTR = "pruned_heads"  # transformers v4's config field: {layer: [head ids]} of one attention group
V4_GROUP = {"bert-like": "enc_self", "distilbert": "enc_self", "vit-like": "enc_self"}  # families v4 pruned, and the group it meant
# (v4's T5 prune_heads failed with an AttributeError, so no T5 directory was ever pruned by v4 nor loads pruned in it)


def v4_pruned_heads(model: nn.Module, record: dict) -> dict[str, list[int]] | None:
    """The record in v4's ``config.pruned_heads`` layout ({layer: [ids]}), or None when v4 cannot express it."""
    group = V4_GROUP.get(family_for(model).name)
    if group is None or set(record) - {group}:
        return None
    return {layer: list(ids) for layer, ids in record.get(group, {}).items()}


def _record_from_v4(family_name: str, pruned_heads: dict) -> dict[str, dict[str, list[int]]]:
    """A headprune record from v4's ``config.pruned_heads`` of a model of this family."""
    group = V4_GROUP.get(family_name)
    if group is None:
        raise ValueError(f"config.json has v4 pruned_heads, but v4 pruned no heads in the {family_name} family")
    layers = {str(int(layer)): sorted(int(h) for h in ids) for layer, ids in pruned_heads.items() if ids}
    return {group: layers} if layers else {}


def weights_digest(site: AttentionSite) -> str:
    """SHA-256 of one attention module's kept head ids and its q/k/v/output weights (as float32)."""
    digest = hashlib.sha256(json.dumps(site.head_ids).encode())
    for which in ("query", "key", "value", "output"):
        linear = site.linear(which)
        tensors = [linear.weight] + ([linear.bias] if linear.bias is not None and which != "output" else [])
        for tensor in tensors:
            digest.update(tensor.detach().to("cpu", torch.float32).contiguous().numpy().tobytes())
    return digest.hexdigest()


def save_pruned(model: nn.Module, path: str | Path, tokenizer=None) -> Path:
    """Write the model (HF format), its tokenizer and ``headprune_pruning.json`` to ``path``."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"save_pruned takes a directory to write the model into; {path} is a file: give a new or existing directory")
    path.mkdir(parents=True, exist_ok=True)
    record = pruning_record(model)
    setattr(model.config, RECORD_ATTR, record)
    v4_record = v4_pruned_heads(model, record)
    if v4_record is not None:
        setattr(model.config, V4_ATTR, v4_record)  # transformers v4 reads this and prunes before loading the weights
    ffn = ffn_meta(model)  # FFN neurons: the config's width fields are brought up to date before it is written
    hidden = hidden_meta(model)  # residual channels: their record into the config before it is written
    layers = getattr(model.config, REMOVED_ATTR, None) or {}  # removed layers {group: [original ids]}: config.json holds them too
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    sites = find_sites(model)
    heads = {f"{s.group}.{s.layer}": len(s.head_ids) for s in sites}
    digests = {f"{s.group}.{s.layer}": weights_digest(s) for s in sites}
    meta = {
        "model_type": model.config.model_type,
        "architecture": type(model).__name__,
        "pruned_heads": record,
        "heads_present": heads,
        "weights_sha256": digests,
        **ffn,
        **hidden,
        **({"removed_layers": layers} if layers else {}),
    }
    (path / RECORD_FILE).write_text(json.dumps(meta, indent=1))
    return path


def _read_weights(file: Path) -> dict[str, torch.Tensor]:
    """One weights file, or a ValueError naming it (a truncated or damaged file)."""
    try:
        if file.suffix == ".safetensors":
            return load_file(str(file))
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - safetensors and torch raise their own types for a damaged file
        raise ValueError(
            f"{file} cannot be read as weights ({type(err).__name__}: {err}): the file is damaged or truncated; save the model again"
        ) from None


def _read_record(file: Path) -> dict:
    """``headprune_pruning.json``, or a ValueError naming it."""
    try:
        return json.loads(file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{file} is not valid JSON ({err}): the file is damaged or truncated; save the model again") from None


def _state_dict_from(path: Path) -> dict[str, torch.Tensor]:
    files = sorted(path.glob("*.safetensors"))
    if files:
        state = {}
        for file in files:
            state.update(_read_weights(file))
        return state
    bin_file = path / "pytorch_model.bin"
    if bin_file.exists():
        return _read_weights(bin_file)
    raise FileNotFoundError(f"no weights (*.safetensors or pytorch_model.bin) in {path}")


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
    record = getattr(config, RECORD_ATTR, None) or {}
    meta_file = path / RECORD_FILE
    meta = _read_record(meta_file) if meta_file.exists() else {}
    if meta and meta["pruned_heads"] != record:
        raise ValueError(f"{meta_file} and config.json disagree on the pruned heads: {meta['pruned_heads']} vs {record}")
    build_width(config)  # a model with residual channels removed is built at its original width, then sliced
    model = model_class._from_config(config)
    layers = getattr(config, REMOVED_ATTR, None) or {}
    if meta and meta.get("removed_layers", {}) != layers:
        raise ValueError(f"{meta_file} and config.json disagree on the removed layers: {meta.get('removed_layers', {})} vs {layers}")
    restore_layer_ids(model, layers)  # heads and FFN widths below are recorded by original layer id
    v4_record = getattr(config, V4_ATTR, None)
    if v4_record and not record:  # a directory pruned by transformers v4 (save_pruned writes both: ours wins)
        record = _record_from_v4(family_for(model).name, v4_record)
    try:
        prune_heads(model, record)
    except (IndexError, ValueError) as err:
        raise ValueError(f"the pruning record in {path} does not match a {config.model_type} model with this config: {err}") from err
    rebuild_ffn(model, meta, path)  # FFN widths per layer, by original neuron id
    rebuild_hidden(model, path)  # residual channels, by original id
    expected = model.state_dict()
    state = _model_keys(model, _in_model_names(model, _state_dict_from(path)), expected)
    _pad_emptied_v4_layers(state, expected)
    wrong = [k for k, v in state.items() if k in expected and expected[k].shape != v.shape]
    if wrong:
        k = wrong[0]
        raise ValueError(
            f"the pruning record in {path} does not match its weights: {k} has shape {tuple(state[k].shape)} "
            f"in the file but {tuple(expected[k].shape)} after pruning {record} ({len(wrong)} tensors differ)"
        )
    missing, _ = model.load_state_dict(state, strict=False)
    check_digests(find_sites(model), meta.get("weights_sha256"), weights_digest, "attention module", "head", path)
    check_digests(ffn_sites_if_any(model), meta.get(FFN_DIGESTS), ffn_digest, "feed-forward block", "neuron", path)
    model.tie_weights()
    tied = {
        name for name, p in model.named_parameters(remove_duplicate=False) if any(p is q for n, q in model.named_parameters() if n in state)
    }
    left = [k for k in missing if k not in tied and not k.endswith("embed_positions.weight")]
    if left:
        raise ValueError(f"weights missing from {path}: {left[:5]}")
    return model.eval()


def _model_keys(model: nn.Module, state: dict[str, torch.Tensor], expected: dict) -> dict[str, torch.Tensor]:
    """The file's keys renamed as transformers renames them on load (GPT-NeoX saves ``embed_out``, loads ``lm_head``)."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightRenaming, apply_renamings

    if all(key in expected for key in state):
        return state
    renamings = [t for t in get_model_conversion_mapping(model) if type(t) is WeightRenaming]
    return {key if key in expected else apply_renamings(key, renamings): value for key, value in state.items()}


def _in_model_names(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The file's weights under the model's names: transformers writes some models (ViT, DeiT) in their older layout."""
    from transformers.core_model_loading import revert_weight_conversion

    own = model.state_dict()
    by_tensor = {id(tensor): name for name, tensor in own.items()}
    renamed = {saved: by_tensor.get(id(tensor)) for saved, tensor in revert_weight_conversion(model, dict(own)).items()}
    return {renamed.get(name) or name: tensor for name, tensor in state.items()}  # renames only; other conversions stay as saved


def _pad_emptied_v4_layers(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    """v4 stores a layer with no heads left as 0-row q/k/v and 0-column output weights: add our zero phantom head."""
    for key, value in state.items():
        target = expected.get(key)
        if target is None or target.shape == value.shape or value.numel() or value.dim() != target.dim():
            continue
        state[key] = value.new_zeros(target.shape)


def check_digests(sites: list, digests: dict | None, digest, what: str, noun: str, path: Path) -> None:
    """Compare each site's weights digest with the one saved (directories without digests pass)."""
    for site in sites if digests else ():
        name = f"{site.group}.{site.layer}"
        if name in digests and digests[name] != digest(site):
            raise ValueError(
                f"the pruning record in {path} does not match its weights: {what} {name} (kept {noun}s {site.unit_ids}) has "
                f"another SHA-256 than when it was saved; the record names other {noun}s than were pruned, or the weights "
                f"changed after saving. Restore {RECORD_FILE} and config.json."
            )
