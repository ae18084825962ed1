"""Each calibration token's weight in a layer-wise fit: how much an error at a projection's output moves the task loss.

A re-solved projection's output error at token t costs the loss about (1/2) sum_o g_to^2 dy_to^2 (the Gauss-Newton
diagonal), g_t = dL/dy_t in the unpruned model. Fitting every token alike spends the fit on tokens the loss never reads
(a classifier reads one token of the last layer); weighting token t by a_t = ||g_t||^2 / mean_t ||g_t||^2 keeps the
total weight of the uniform fit (the mean is 1) and matches the loss's rank-one (token x output) approximation.
"""

import contextlib
from functools import partial

import torch
from torch import nn

from headprune.core.inputs import eval_mode, hooks_removed, model_inputs, valid_token_rows
from headprune.scoring.importance import per_example_loss

TOKEN_WEIGHTS = ("uniform", "gradient")  # prune.reconstruct.tokens and prune.obs_tokens: tokens alike, or by the gradient


@contextlib.contextmanager
def _parameters_tracked(model: nn.Module):
    """Every parameter of ``model`` requires grad inside (so outputs carry a graph), as it was after."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


def gradient_token_weights(teacher: nn.Module, names: dict[str, list[int] | None], batches: list[dict]) -> dict[str, list[torch.Tensor]]:
    """{name: per batch (N,)}: a_t = ||dL/dy_t||^2 at the projection's output (its ``names[name]`` rows; None: all) in the
    unpruned ``teacher``, real tokens, over all batches scaled to mean 1; the labels of the batches give L."""
    if not names:  # nothing re-solved on its own (removed layers alone): no pass to weigh
        return {}
    modules = dict(teacher.named_modules())
    squares: dict[str, list[torch.Tensor]] = {name: [] for name in names}
    store: dict = {}

    def keep(module, args, output, key):
        store.setdefault(key, output)  # with its graph: the gradient is taken at it

    hooks = [modules[name].register_forward_hook(partial(keep, key=name)) for name in names]
    with hooks_removed(hooks), eval_mode(teacher), _parameters_tracked(teacher), torch.enable_grad():
        for batch in batches:
            store.clear()
            loss = per_example_loss(teacher(**model_inputs(teacher, batch)), batch).sum()
            missing = [name for name in names if name not in store]
            if missing:
                raise ValueError(f"prune.reconstruct.tokens=gradient: {missing} did not run in the unpruned model's pass")
            grads = torch.autograd.grad(loss, [store[name] for name in names], allow_unused=True)
            for (name, rows), g in zip(names.items(), grads):
                g = torch.zeros_like(store[name]) if g is None else g.detach()  # None: the loss does not reach it
                g = valid_token_rows(g, batch).double().cpu()  # (N, out)
                squares[name].append((g if rows is None else g[:, rows]).square().sum(1))
    weights = {}
    for name, per_batch in squares.items():
        total = torch.cat(per_batch) if per_batch else torch.zeros(0, dtype=torch.float64)
        mean = float(total.mean()) if total.numel() else 0.0
        if not mean > 0:
            raise ValueError(
                f"prune.reconstruct.tokens=gradient: the task loss has no gradient at {name} on the calibration batches; "
                "use prune.reconstruct.tokens=uniform"
            )
        weights[name] = [w / mean for w in per_batch]
    return weights
