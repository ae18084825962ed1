"""Run a model one Transformer layer at a time (each layer's call caught, then replayed); catch chosen modules' inputs or outputs.
Replaying a layer on the cached outputs of the one below costs one pass per projection group, not one up to every projection."""

import contextlib
from contextlib import contextmanager
from functools import partial

import torch
from torch import nn

from headprune.core.inputs import hooks_removed, model_inputs
from headprune.core.layer.sites import INPUT_NAMES, layer_stacks


class _Stop(Exception):
    """Raised by a hook to end a forward pass or a replay once what it wanted has run."""


def stacks_of(model: nn.Module) -> list[list[str]]:
    """The paths of the model's layers, one list per stack, in model order."""
    out: dict[str, list[str]] = {}
    for layer, (stack, _) in layer_stacks(model).items():
        out.setdefault(stack, []).append(layer)
    return [sorted(layers, key=lambda p: int(p.rsplit(".", 1)[1])) for layers in out.values()]


def kept_layer_paths(model: nn.Module, teacher: nn.Module) -> dict[str, str | None]:
    """{the teacher's layer path: the path of the same layer in ``model`` (None: removed)}, by original layer id."""
    from headprune.core.layer.sites import find_layer_sites

    sites = {id(site.module): site for site in find_layer_sites(model)}
    ours = {}
    for path, (stack, _) in layer_stacks(model).items():
        site = sites.get(id(model.get_submodule(path)))
        ours[f"{stack}.{site.layer}" if site is not None else path] = path
    return {path: ours.get(path) for path in layer_stacks(teacher)}


def renamed(name: str, paths: dict[str, str | None]) -> str | None:
    """The name in the pruned model of the teacher's module ``name`` (``paths``: kept_layer_paths), None in a removed layer."""
    layer = layer_of(name, list(paths))
    if layer is None:
        return name
    mine = paths[layer]
    return None if mine is None else mine + name[len(layer) :]


def layer_of(name: str, layers: list[str]) -> str | None:
    """The layer (of ``layers``) that holds the module ``name``, or None."""
    return next((layer for layer in layers if name.startswith(layer + ".")), None)


@contextmanager
def no_cache(model: nn.Module):
    """Within the block the model keeps no KV cache (a replayed layer would append to it again)."""
    config = getattr(model, "config", None)
    before = getattr(config, "use_cache", None)
    if before is not None:
        config.use_cache = False
    try:
        yield
    finally:
        if before is not None:
            config.use_cache = before


@torch.no_grad()
def layer_calls(model: nn.Module, layers: list[str], batch: dict) -> dict[str, tuple[tuple, dict]]:
    """{layer path: (args, kwargs) of its call} from one forward pass of ``batch``."""
    modules = dict(model.named_modules())
    calls: dict[str, tuple[tuple, dict]] = {}
    handles = [
        modules[p].register_forward_pre_hook(lambda m, a, k, p=p: calls.setdefault(p, (a, dict(k))), with_kwargs=True) for p in layers
    ]
    with hooks_removed(handles), no_cache(model):
        model(**model_inputs(model, batch))
    return calls


def hidden_input(call: tuple[tuple, dict]) -> torch.Tensor:
    """The hidden states a layer call takes (its first argument, or its ``hidden_states`` keyword)."""
    args, kwargs = call
    if args:
        return args[0]
    return next(kwargs[name] for name in INPUT_NAMES if name in kwargs)


def with_input(call: tuple[tuple, dict], hidden: torch.Tensor) -> tuple[tuple, dict]:
    """The same layer call on other hidden states."""
    args, kwargs = call
    if args:
        return (hidden, *args[1:]), kwargs
    name = next(name for name in INPUT_NAMES if name in kwargs)
    return args, {**kwargs, name: hidden}


@torch.no_grad()
def replay(layer: nn.Module, call: tuple[tuple, dict]) -> torch.Tensor:
    """The layer's output hidden states on its call."""
    args, kwargs = call
    with no_cache(layer):
        out = layer(*args, **kwargs)
    return out[0] if isinstance(out, (tuple, list)) else out


@contextmanager
def caught(modules: dict, outputs: bool = False, stop: bool = False):
    """Each of ``modules`` puts its first input (``outputs``: output) in the yielded {key: tensor} in run order; ``stop`` ends the pass."""
    store: dict = {}

    def hook(module, args, output, key):
        store.setdefault(key, (output if outputs else args[0]).detach())
        if stop and len(store) == len(modules):
            raise _Stop

    with hooks_removed([m.register_forward_hook(partial(hook, key=key)) for key, m in modules.items()]), contextlib.suppress(_Stop):
        yield store


@torch.no_grad()
def replay_caught(layer: nn.Module, call: tuple[tuple, dict], modules: dict, outputs: bool = True, stop: bool = False) -> tuple:
    """(layer output, None where ``stop`` ended it; {key: each module's output (``outputs``) or input, in run order}) of this call."""
    out = None
    with caught(modules, outputs, stop) as store:
        out = replay(layer, call)
    return out, store


def captured_pass(model: nn.Module, modules: dict, batch: dict, outputs: bool = False, stop: bool = False) -> dict:
    """{key: the first input (``outputs``: output) of ``modules[key]``} in forward order from one pass of ``batch`` (``stop``: early)."""
    with caught(modules, outputs, stop) as store:
        model(**model_inputs(model, batch))
    return store
