"""Residual-stream channels: the coupled group of tensors on a model's ``hidden_size`` axis, and the gates on it."""

from dataclasses import dataclass, field

import torch
from torch import nn

from headprune.core.attention.gates import find_sites
from headprune.core.families import family_for
from headprune.core.ffn.sites import ffn_sites_if_any
from headprune.core.projections import in_features, is_projection, out_features
from headprune.core.site_gates import Site, gate_and_probe, kept_on

GROUP = "hidden"
IDS_ATTR = "_headprune_hidden"  # on the model: {"width_orig": d, "ids": original ids of the channels present}
SITE_ATTR = "_headprune_hidden_site"  # the site, on its module
HOOK_ATTR = "_headprune_hidden_hook"
ROWS_ATTR = "_headprune_hidden_rows"  # the book's examples-per-forward record, on the token embeddings
HEAD_READERS = (
    "lm_head",
    "pooler.dense",
    "pre_classifier",
    "classifier.dense",
    "score",
    "qa_outputs",
    "cls_classifier",
    "distillation_classifier",
)
POOLED = ("pooler", "pre_classifier")  # a model holding one: its ``classifier`` reads the pooled vector, not the stream
REFUSED_FAMILIES = {
    "whisper": "its encoder's stream starts from two audio convolutions and sinusoidal positions, outside the coupled group",
    "deberta-v2": "its relative-position embeddings have the residual width but feed the attention's position projections, not the stream",
}


@dataclass(eq=False)
class HiddenSite(Site):
    """One place the channel gate acts: a write into the stream (``write``) or a norm over it (``norm``); its units: channels."""

    module: nn.Module
    role: str  # "write" or "norm"
    rows: dict = field(default_factory=dict)  # {"rows": examples of the model's current forward}


@dataclass
class HiddenGroup:
    """Every tensor of one model on the residual axis, by role."""

    width: int
    writes: list[tuple[str, nn.Module]]  # gated at the output: embeddings and sub-block output projections
    norms: list[tuple[str, nn.Module]]
    readers: list[nn.Module]  # projections whose input columns are channels
    writers: list[nn.Module]  # projections whose output rows are channels
    embeddings: list[nn.Module]  # nn.Embedding tables whose columns are channels
    image_embeddings: list[nn.Module]  # modules whose own parameters end in the channel axis, with a patch Conv2d


def hidden_width(model: nn.Module) -> int:
    """The residual width the model computes now (config.hidden_size: n_embd, d_model, dim ... by the config's attribute map)."""
    width = getattr(model.config, "hidden_size", None) or getattr(model.config, "dim", None)
    if not isinstance(width, int):
        raise ValueError(f"{type(model.config).__name__} has no integer hidden_size: its residual channels cannot be found")
    return width


def channel_book(model: nn.Module) -> dict:
    """{"width_orig": d, "ids": original ids of the channels present}, created at the first call."""
    book = getattr(model, IDS_ATTR, None)
    if book is None:
        width = hidden_width(model)
        book = {"width_orig": width, "ids": list(range(width)), "rows": {}}
        setattr(model, IDS_ATTR, book)
    return book


def _head_readers(model: nn.Module, width: int) -> list[nn.Module]:
    names = dict(model.named_modules())
    pooled = any(n.rpartition(".")[2] in POOLED and m is not None for n, m in names.items())
    readers = []
    for name, module in names.items():
        if not is_projection(module) or in_features(module) != width:
            continue
        if any(name == r or name.endswith("." + r) for r in HEAD_READERS) or (name.rpartition(".")[2] == "classifier" and not pooled):
            readers.append(module)
    return readers


def _image_embeddings(model: nn.Module, width: int) -> list[tuple[str, nn.Module]]:
    """The outermost ``...Embeddings`` modules holding a patch Conv2d of ``width`` output channels (ViT, DeiT)."""
    out, inside = [], set()
    for name, module in model.named_modules():
        if id(module) in inside or not type(module).__name__.endswith("Embeddings"):
            continue
        if any(isinstance(m, nn.Conv2d) and m.out_channels == width for m in module.modules()):
            out.append((name, module))
            inside.update(id(m) for m in module.modules())
    return out


def hidden_group(model: nn.Module) -> HiddenGroup:
    """The model's coupled group on the residual axis; a ValueError where a tensor of it has another width."""
    width = hidden_width(model)
    family = family_for(model)
    attention, ffn = find_sites(model), ffn_sites_if_any(model)
    readers = [s.linear(w) for s in attention for w in ("query", "key", "value")] + [s.projection(p) for s in ffn for p in s.up_paths()]
    readers = list({id(m): m for m in readers + _head_readers(model, width)}.values())  # each once (a fused q/k/v projection)
    writers = list({id(m): m for m in [s.linear("output") for s in attention] + [s.down() for s in ffn]}.values())
    wrong = [m for m in readers if in_features(m) != width] + [m for m in writers if out_features(m) != width]
    if wrong:
        raise ValueError(
            f"{type(wrong[0]).__name__} {wrong[0]} reads or writes the residual stream at another width than hidden_size={width}: "
            "its residual channels are no single coupled group"
        )
    images = _image_embeddings(model, width)
    inside_image = {id(m) for _, e in images for m in e.modules()}
    embeddings = [
        (n, m) for n, m in model.named_modules() if isinstance(m, nn.Embedding) and m.embedding_dim == width and id(m) not in inside_image
    ]
    norms = [  # a norm over the stream (not one across heads: the family's cross_head_norms)
        (n, m)
        for n, m in model.named_modules()
        if "Norm" in type(m).__name__ and isinstance(getattr(m, "weight", None), nn.Parameter) and tuple(m.weight.shape) == (width,)
        if n.rpartition(".")[2] not in family.cross_head_norms
    ]
    writes = embeddings + images + [(n, m) for n, m in model.named_modules() if any(m is w for w in writers)]
    return HiddenGroup(width, writes, norms, readers, writers, [m for _, m in embeddings], [m for _, m in images])


def family_refusal(family, model_type: str) -> str | None:
    """Why a family of the table never has its residual channels removed (None: it may; ``family`` None: not in the table)."""
    reason = None if family is None else REFUSED_FAMILIES.get(family.name)
    return reason and f"the residual channels of {model_type} models cannot be removed exactly: {reason}"


def hidden_refusal(model: nn.Module) -> str | None:
    """Why this model's residual channels cannot be gated and removed exactly (None: they can)."""
    reason = family_refusal(family_for(model), model.config.model_type)
    if reason:
        return reason
    try:
        hidden_group(model)
    except ValueError as err:
        return str(err)
    return None


# ---- the gate hooks -----------------------------------------------------------------------------------------
def _gate_of(site: HiddenSite, stream: torch.Tensor) -> torch.Tensor | None:
    """The gate as it multiplies ``stream`` (..., d'), per example for a batch-shared stream (1, T, d); None: nothing to do."""
    shape, rows = stream.shape, site.rows.get("rows", 1)
    if shape[0] == 1 and rows > 1:
        shape = (rows, *shape[1:])
    elif stream.dim() == 2 and rows > 1 and shape[0] != rows:  # Marian's sinusoidal positions: (T, d), no batch axis
        shape = (rows, *shape)
    return gate_and_probe(site, stream.expand(shape))


def gated_norm(module: nn.Module, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """The norm of g * x with the statistics of the channel weights g / sum(g), times g."""
    # LayerNorm: mu = sum(g x~) / sum(g), var = sum(g (x~ - mu)^2) / sum(g); RMSNorm: ms = sum(g x~^2) / sum(g).
    # A hard g in {0, 1} gives the same norm over the kept channels only: masked == pruned, weights and eps unchanged.
    wide = torch.promote_types(x.dtype, torch.float32)  # statistics in float32 at least, as the norms compute them
    g = gate.to(wide).expand(x.shape)
    xs = x.to(wide) * g
    count = g.sum(-1, keepdim=True).clamp(min=1e-12)
    if isinstance(module, nn.LayerNorm):
        mean = (g * xs).sum(-1, keepdim=True) / count
        var = (g * (xs - mean).pow(2)).sum(-1, keepdim=True) / count
        out = (xs - mean) * torch.rsqrt(var + module.eps)
        if module.weight is not None:
            out = out * module.weight.to(wide)
        if module.bias is not None:
            out = out + module.bias.to(wide)
        return (out * g).to(x.dtype)
    # RMSNorm of any scale: the module's own forward on alpha * x~, whose mean square over all d is sum(g x~^2) / sum(g)
    whole = xs.pow(2).mean(-1, keepdim=True)
    wanted = (g * xs.pow(2)).sum(-1, keepdim=True) / count
    ratio = torch.where(whole > 0, wanted / whole.clamp(min=1e-30), torch.ones_like(whole))  # an all-zero token: alpha 1
    alpha = ratio.clamp(min=1e-30).sqrt()
    out = module.forward((xs * alpha).to(x.dtype)).to(wide) / alpha
    return (out * g).to(x.dtype)


def _gate_hook(module, args, kwargs, output):
    site = getattr(module, SITE_ATTR)
    if site.gate is None and not site.recording:
        return None
    if site.role == "write":
        gate = _gate_of(site, output)
        return output if gate is None else output * gate
    x = args[0] if args else next(iter(kwargs.values()))
    gate = _gate_of(site, x)
    return output if gate is None else gated_norm(module, x, gate)


def _note_rows(model, args, kwargs):
    """The model's forward pre-hook: the examples of this forward, for streams the batch shares."""
    given = [kwargs.get(name) for name in ("input_ids", "inputs_embeds", "pixel_values", "input_features")] + list(args[:1])
    first = next((x for x in given if isinstance(x, torch.Tensor)), None)
    channel_book(model)["rows"]["rows"] = first.shape[0] if first is not None else 1


def _note_token_rows(module, args) -> None:
    """The token embeddings' forward pre-hook: the examples of token ids (B, T)."""
    if args and isinstance(args[0], torch.Tensor) and args[0].dim() >= 2:
        getattr(module, ROWS_ATTR)["rows"] = args[0].shape[0]


def hidden_sites(model: nn.Module) -> list[HiddenSite]:
    """Every gate site of the model's residual channels (writes, then norms), hooked once per module."""
    group, book = hidden_group(model), channel_book(model)
    ids = book["ids"]
    if getattr(model, HOOK_ATTR, None) is None:
        setattr(model, HOOK_ATTR, model.register_forward_pre_hook(_note_rows, with_kwargs=True))
        tokens = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
        if isinstance(tokens, nn.Module):  # generate() runs the encoder alone, the LM scorer the base model: the ids say the batch
            setattr(tokens, ROWS_ATTR, book["rows"])  # an attribute, not a closure: a deep copy's hook writes the copy's book
            tokens.register_forward_pre_hook(_note_token_rows)
    sites = []
    for role, named in (("write", group.writes), ("norm", group.norms)):
        for path, module in named:
            site = kept_on(module, SITE_ATTR, lambda: HiddenSite(path, GROUP, 0, book["width_orig"], ids, module, role, book["rows"]))
            site.unit_ids = ids  # original ids of the channels present, in weight order
            kept_on(module, HOOK_ATTR, lambda: module.register_forward_hook(_gate_hook, with_kwargs=True))
            sites.append(site)
    return sites
