"""Removing residual channels from the weights, their record in saved models, and their FLOPs."""

import copy

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from headprune.core.attention.gates import find_sites
from headprune.core.hidden.sites import GROUP, IDS_ATTR, channel_book, hidden_group, hidden_sites
from headprune.core.projections import in_features, out_features
from headprune.core.site_gates import Site, removed_record

CONFIG_ATTR = "headprune_hidden_channels"


class Slicer:
    """Slices parameters and buffers by the kept positions, each tied tensor once (a second holder gets the same new one)."""

    def __init__(self, index: torch.Tensor):
        self.index, self.done = index, {}

    def take(self, module: nn.Module, dim: int, *names: str) -> None:
        """Keep the positions of ``module``'s parameters or buffers ``names`` along ``dim``."""
        for name in names:
            value = getattr(module, name, None)
            if value is None:
                continue
            new = self.done.get(id(value))
            if new is None:
                kept = value.detach().index_select(dim % value.dim(), self.index.to(value.device)).clone()
                if isinstance(value, nn.Parameter):
                    kept = nn.Parameter(kept, requires_grad=value.requires_grad)
                new = self.done[id(value)] = (value, kept)
            if new[1].shape[dim % value.dim()] != len(self.index) or new[0] is not value:
                raise ValueError(
                    f"{type(module).__name__}.{name} is tied to a tensor sliced along another axis: the residual channels of this "
                    "model cannot be removed (tied weights across different widths)"
                )
            if isinstance(new[1], nn.Parameter):
                setattr(module, name, new[1])
            else:
                module.register_buffer(name, new[1], persistent=name in module.state_dict())


def _slice_projection(slicer: Slicer, module: nn.Module, outputs: bool) -> None:
    """Slice a projection's output rows (``outputs``, with its bias) or its input columns to the kept channels."""
    conv1d = isinstance(module, Conv1D)  # weight [in, out]; nn.Linear's [out, in]
    slicer.take(module, int(conv1d == outputs), "weight")
    if outputs:
        slicer.take(module, 0, "bias")
    out_name, in_name = ("nf", "nx") if conv1d else ("out_features", "in_features")
    setattr(module, out_name if outputs else in_name, len(slicer.index))


def _scale_norm(module: nn.Module, factor: float) -> None:
    """Multiply a norm's output by ``factor`` through its scale (Gemma's scale is 1 + weight)."""
    with torch.no_grad():
        if type(module).__name__.startswith("Gemma"):
            module.weight.copy_((1 + module.weight) * factor - 1)
        else:
            module.weight.mul_(factor)


def _fold_width_constants(model: nn.Module, old: int, new: int) -> None:
    """Keep constants a stock model derives from hidden_size (T5 tied head d^-0.5, Gemma embeddings d^0.5) by folding into weights."""
    ratio = (new / old) ** 0.5
    final_norm = hidden_group(model).norms[-1][1]  # the last norm: the one the LM head reads
    if model.config.model_type == "t5" and getattr(model, "model_dim", None) == old and model.config.tie_word_embeddings:
        model.model_dim = new
        _scale_norm(final_norm, ratio)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for module in model.modules():
        if isinstance(module, nn.Embedding) and getattr(module, "scalar_embed_scale", None) == old**0.5:
            module.scalar_embed_scale = new**0.5
            module.embed_scale.fill_(new**0.5)
            with torch.no_grad():
                module.weight.div_(ratio)
            if head is not None and head.weight is module.weight:
                _scale_norm(final_norm, ratio)


def keep_channels(model: nn.Module, keep: list[int]) -> None:
    """Slice every tensor of the residual group down to the channels at positions ``keep`` (of the present ones)."""
    group = hidden_group(model)
    book = channel_book(model)
    if not keep:
        raise ValueError("a hidden mask must keep at least one residual channel: every channel of the stream would be removed")
    slicer = Slicer(torch.tensor(keep, dtype=torch.long))
    with torch.no_grad():
        for module in group.readers:
            _slice_projection(slicer, module, outputs=False)
        for module in group.writers:
            _slice_projection(slicer, module, outputs=True)
        for module in group.embeddings:
            slicer.take(module, 1, "weight")
            module.embedding_dim = len(keep)
        for _, module in group.norms:
            slicer.take(module, 0, "weight", "bias")
            if isinstance(module, nn.LayerNorm):
                module.normalized_shape = (len(keep),)
        for module in group.image_embeddings:
            for name, param in list(module.named_parameters(recurse=False)):
                if param.shape[-1] == group.width:
                    slicer.take(module, -1, name)
            for conv in (m for m in module.modules() if isinstance(m, nn.Conv2d) and m.out_channels == group.width):
                slicer.take(conv, 0, "weight", "bias")
                conv.out_channels = len(keep)
    book["ids"] = [book["ids"][k] for k in keep]
    model.config.hidden_size = len(keep)
    head_dims = {site.head_dim for site in find_sites(model)}
    if len(head_dims) == 1 and hasattr(model.config, "num_attention_heads"):
        try:
            model.config.head_dim = head_dims.pop()  # the attention's head size no longer follows from hidden_size / heads
        except AttributeError:
            pass  # a config deriving head_dim (Falcon): the modules keep theirs, load_pruned builds at the original width
    _fold_width_constants(model, group.width, len(keep))
    hidden_sites(model)  # the sites see the new ids


def prune_hidden_mask(model: nn.Module, mask: dict[str, torch.Tensor]) -> dict:
    """Remove every channel whose entry of the hard mask {"hidden": [1, d]} (by original id) is 0; returns the record."""
    value = mask[GROUP]
    ids = channel_book(model)["ids"]
    keep = [k for k, channel in enumerate(ids) if value[0, channel] != 0]
    if len(keep) < len(ids):
        keep_channels(model, keep)
    return hidden_record(model)


def hidden_record(model: nn.Module) -> dict:
    """{"hidden": {"0": [removed original ids]}}, or {} while every channel is present."""
    book = getattr(model, IDS_ATTR, None)  # the stream's record as one site's
    return removed_record([Site(GROUP, GROUP, 0, book["width_orig"], book["ids"])]) if book else {}


# ---- saving and loading ------------------------------------------------------------------------------------
def hidden_meta(model: nn.Module) -> dict | None:
    """The entries of headprune_pruning.json (None when no channel is removed); writes the record into the config first."""
    record = hidden_record(model)
    if not record:
        return None
    book = channel_book(model)
    refused = _refusal(model.config, model.config.hidden_size)  # Llama, Gemma: a multiple of the heads
    if refused is not None:
        raise ValueError(
            f"a {model.config.model_type} config refuses hidden_size={model.config.hidden_size} ({refused}): keep a multiple of "
            f"{getattr(model.config, 'num_attention_heads', None)} residual channels so that stock transformers can build the pruned model"
        )
    setattr(model.config, CONFIG_ATTR, {"width_orig": book["width_orig"], "removed": record[GROUP]["0"]})
    return {"hidden_size_orig": book["width_orig"], "pruned_channels": record}


def _refusal(config, width: int) -> Exception | None:
    """What the config's own validator raises for ``hidden_size=width`` (None: it takes it, as a config without one does)."""
    probe = copy.deepcopy(config)
    probe.hidden_size = width
    validate = getattr(probe, "validate", None)
    try:
        if validate is not None:
            validate()
    except Exception as err:  # noqa: BLE001 - huggingface_hub wraps the validator's ValueError in its own type
        return err
    return None


def hidden_width_multiple(model: nn.Module) -> int:
    """The least multiple of residual channels the model's config takes: num_attention_heads where it refuses others (Llama, Gemma), else 1."""
    config = model.config
    heads, width = getattr(config, "num_attention_heads", None), getattr(config, "hidden_size", None)
    if not isinstance(heads, int) or heads <= 1 or not isinstance(width, int):
        return 1
    multiple = heads * max(1, width // heads)
    return heads if _refusal(config, multiple) is None and _refusal(config, multiple + 1) is not None else 1


def build_width(config) -> None:
    """Before a saved model is built: its config at the original residual width (the record then slices it)."""
    saved = getattr(config, CONFIG_ATTR, None)
    if saved:
        config.hidden_size = int(saved["width_orig"])


def rebuild_hidden(model: nn.Module, meta: dict | None, path) -> None:
    """After building at the original width: remove the recorded channels by original id (config.json holds the record, not ``meta``)."""
    saved = getattr(model.config, CONFIG_ATTR, None)
    if not saved:
        return
    width, removed = int(saved["width_orig"]), {int(c) for c in saved["removed"]}
    if hidden_group(model).width != width or not removed or max(removed) >= width:
        raise ValueError(f"the residual-channel record in {path} does not match a model of hidden_size {width}: {saved}")
    keep_channels(model, [c for c in range(width) if c not in removed])


# ---- FLOPs ---------------------------------------------------------------------------------------------------
def channel_flops(model: nn.Module, seq_len: int) -> int:
    """Forward FLOPs per residual channel of one example of ``seq_len`` tokens: every projection reading or writing it."""
    group = hidden_group(model)
    return 2 * seq_len * (sum(out_features(m) for m in group.readers) + sum(in_features(m) for m in group.writers))


def hidden_flops_tables(model: nn.Module, seq_len: int = 128) -> dict[str, torch.Tensor]:
    """{"hidden": [1, d + 1]}: the FLOPs of the projections on the residual axis with 0..d channels kept (linear in the width)."""
    width = channel_book(model)["width_orig"]
    return {GROUP: (torch.arange(width + 1, dtype=torch.float64) * channel_flops(model, seq_len)).unsqueeze(0)}
