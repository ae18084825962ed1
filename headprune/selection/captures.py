"""The inputs of chosen modules in one forward pass: what least-squares recovery fits its scales on."""

import contextlib

import torch
from torch import nn

from headprune.core.inputs import hooks_removed, model_inputs


class _Stop(Exception):
    """Raised by a capture hook to end a forward pass once every wanted module has run."""


def captured_module_inputs(model: nn.Module, modules: dict[int, nn.Module], batch: dict, stop: bool = False) -> dict[int, torch.Tensor]:
    """{key: the first input of ``modules[key]``} in forward order, from one forward pass; ``stop`` ends the pass early."""
    store: dict[int, torch.Tensor] = {}
    handles = []
    for key, module in modules.items():

        def hook(module, args, output, key=key):  # noqa: B008 - the key is bound per module
            store.setdefault(key, args[0].detach())
            if stop and len(store) == len(modules):
                raise _Stop

        handles.append(module.register_forward_hook(hook))
    with hooks_removed(handles), contextlib.suppress(_Stop):
        model(**model_inputs(model, batch))
    return store


def captured_module_outputs(model: nn.Module, modules: dict, batch: dict) -> dict:
    """{key: the output of ``modules[key]``} in forward order, from one forward pass."""
    store: dict = {}
    with hooks_removed(
        [m.register_forward_hook(lambda mod, a, out, key=key: store.setdefault(key, out.detach())) for key, m in modules.items()]
    ):
        model(**model_inputs(model, batch))
    return store
