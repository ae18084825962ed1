"""AdamW (no decay on biases and norms) with a linear warm-up and decay, sized to the trainer's steps."""

from __future__ import annotations

import torch


def adamw_with_linear_warmup(model, hp, total_steps) -> dict:
    """Lightning's optimizer dict for ``model`` from ``hp`` (lr, weight_decay, warmup_ratio, warmup_steps)."""
    from transformers import get_linear_schedule_with_warmup

    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.dim() < 2 else decay).append(param)
    groups = [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=hp.lr)
    if not total_steps or total_steps == float("inf"):
        raise ValueError("cannot size the learning-rate schedule: set trainer.max_epochs or trainer.max_steps")
    warmup = hp.warmup_steps if hp.warmup_steps is not None else int(hp.warmup_ratio * int(total_steps))
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup, int(total_steps))
    return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
