"""DuoAttention's optimised streaming gates (Xiao et al. 2024): alpha per unit trained by distillation, the model frozen."""

from collections.abc import Iterable

import torch

from headprune.core.inputs import eval_mode, model_inputs


def _hidden(model, batch: dict) -> torch.Tensor:
    """The final hidden states (N, D) at the distilled positions (the labelled ones, else every real token), in float32."""
    hidden = model.base_model(**model_inputs(model, batch)).last_hidden_state  # (B, T, D)
    labels = batch.get("labels")
    positions = labels != -100 if labels is not None and labels.dim() == 2 else batch["attention_mask"].bool()  # (B, T)
    return hidden[positions.to(hidden.device)].float()


def _targets(model, gates, batches: list[dict]) -> list[torch.Tensor]:
    """The full model's hidden states of every batch (no streaming gate set)."""
    with torch.no_grad(), gates.masked(None):
        return [_hidden(model, batch) for batch in batches]


def _distillation(model, gates, alphas: dict, batch: dict, target: torch.Tensor) -> torch.Tensor:
    """The relative squared error of the hidden states under the gates ``alphas`` ({group: [L, U]}) against ``target``."""
    with gates.masked(alphas):
        hidden = _hidden(model, batch)
    return (hidden - target).pow(2).sum() / target.pow(2).sum().clamp(min=1e-30)


def distillation_loss(model, gates, batches: Iterable[dict], alphas: dict) -> float:
    """The mean distillation loss over ``batches`` with the streaming gates at ``alphas`` (no penalty), without gradients."""
    batches = list(batches)
    targets = _targets(model, gates, batches)
    with torch.no_grad():
        losses = [float(_distillation(model, gates, alphas, b, t)) for b, t in zip(batches, targets)]
    if not losses:
        raise ValueError("the distillation loss needs at least one batch")
    return sum(losses) / len(losses)


def train_stream_gates(
    model, gates, batches: Iterable[dict], steps: int, lr: float, l1: float, init: float = 1.0, progress: bool = False
) -> dict[str, torch.Tensor]:
    """Alphas {group: [L, U]} in [0, 1] trained for ``steps`` Adam steps (one batch each, cycling) from ``init``, the model frozen."""
    from tqdm.auto import tqdm

    batches = list(batches)
    if not batches:
        raise ValueError("DuoAttention's gates need training batches: the importance subset is empty")
    if steps < 1 or lr <= 0 or l1 < 0:
        raise ValueError(f"the gate training needs steps >= 1, lr > 0 and l1 >= 0; got steps={steps}, lr={lr}, l1={l1}")
    device = next(model.parameters()).device
    frozen = [(p, p.requires_grad) for p in model.parameters()]
    alphas = {g: torch.full(shape, float(init), device=device, requires_grad=True) for g, shape in gates.groups.items()}
    optimizer = torch.optim.Adam(list(alphas.values()), lr=lr)
    try:
        for p, _ in frozen:
            p.requires_grad_(False)
        with eval_mode(model), torch.enable_grad():
            targets = _targets(model, gates, batches)
            for step in tqdm(range(steps), desc="duo gates", disable=not progress, leave=False):
                index = step % len(batches)
                optimizer.zero_grad()
                penalty = torch.cat([a.flatten() for a in alphas.values()]).mean()
                # |h(alpha) - h(1)|^2 / |h(1)|^2 + l1 * mean(alpha), h: final hidden states (B, T, D) at the predicted positions
                loss = _distillation(model, gates, alphas, batches[index], targets[index]) + l1 * penalty
                loss.backward()
                optimizer.step()
                with torch.no_grad():
                    for a in alphas.values():
                        a.clamp_(0.0, 1.0)
    finally:
        for p, flag in frozen:
            p.requires_grad_(flag)
    return {g: a.detach().cpu() for g, a in alphas.items()}
