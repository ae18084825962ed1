"""Fine-tune recovery inside the prune experiment: its training batches (examples or a token budget) and its control."""

import copy
import re
from itertools import accumulate
from pathlib import Path

from headprune.core.checks import ConfigError
from headprune.lightning.finetune import finetune_recover
from headprune.lightning.finetune import real_tokens as batch_tokens
from headprune.stages.pareto_plan import recoveries_of, steps_used
from headprune.tasks.base import rows_of


def budget_batches(task, tokens: int, seed: int) -> list[dict]:
    """The first shuffled training batches (``task.training_batches`` with ``seed``) that hold ``tokens`` real input tokens."""
    if tokens < 1:
        raise ValueError(f"a fine-tune token budget must be >= 1 token, got {tokens}")
    wanted = 64
    while True:
        batches = task.training_batches(wanted, seed=seed)
        drawn, total = sum(map(rows_of, batches)), sum(map(batch_tokens, batches))
        if total >= tokens or drawn < wanted:  # enough tokens, or the whole training split drawn
            break
        wanted *= 2
    if total < tokens:
        raise ConfigError(
            f"prune.finetune.tokens={tokens}: the training split holds only {total} tokens (real input tokens of its {drawn} "
            f"examples); set prune.finetune.tokens to at most {total}, or give more training text"
        )
    filled = [seen >= tokens for seen in accumulate(map(batch_tokens, batches))]  # whether the first i + 1 batches hold the budget
    return batches[: filled.index(True) + 1]


def finetune_batches(task, settings, recovery: list[dict], round_: int = 0) -> list[dict]:
    """What ``prune.recover=finetune`` trains on: a token or example budget per round, else the lsq batches."""
    finetune = settings.finetune
    seed = int(finetune.seed) + round_
    if finetune.tokens is not None:
        return budget_batches(task, int(finetune.tokens), seed)
    if finetune.examples is not None:
        return task.training_batches(int(finetune.examples), seed=seed)
    return recovery


def check_finetune_budget(task, settings) -> None:
    """A ``prune.finetune.tokens`` budget the training split can fill, before any work (a ConfigError saying what it holds)."""
    if "finetune" in steps_used(recoveries_of(settings)) and settings.finetune.tokens is not None:
        budget_batches(task, int(settings.finetune.tokens), int(settings.finetune.seed))


def finetune_steps(finetune, batches: list[dict]) -> int:
    """Optimizer steps of one fine-tune: one pass over a token budget's batches, else ``prune.finetune.max_steps``."""
    return len(batches) if finetune.tokens is not None else int(finetune.max_steps)


def check_lora_rank(model, rank: int) -> None:
    """A LoRA rank no larger than the pruned model's smallest projection (a ConfigError otherwise)."""
    from headprune.lightning.lora import smallest_projection

    smallest = smallest_projection(model)
    if rank > smallest:
        raise ConfigError(
            f"prune.finetune.lora_rank={rank} is larger than the smallest projection of the pruned model ({smallest} features: "
            f"pruning narrowed its attention projections); choose at most {smallest}, or null for a full fine-tune"
        )


def checkpoint_folder(out, name: str) -> Path | None:
    """Where the fine-tune of a point named ``name`` keeps its resume checkpoints: ``<run>/finetune_state/<name>``."""
    return None if out is None else Path(out) / "finetune_state" / re.sub(r"[^A-Za-z0-9_.=+-]+", "_", name)


def finetune_in_place(model, teacher, batches: list[dict], finetune, logger, label: str, checkpoints: Path | None = None) -> list[dict]:
    """``prune.finetune`` steps on ``batches``, distilled from ``teacher`` (its requires_grad flags are kept); resumable in ``checkpoints``."""
    weight, layer_distill = float(finetune.distill_weight), float(finetune.layer_distill)
    device = next(model.parameters()).device
    flags = [p.requires_grad for p in teacher.parameters()]
    rank = finetune.lora_rank
    if rank is not None:
        check_lora_rank(model, int(rank))
    try:
        return finetune_recover(
            model,
            batches,
            teacher=teacher if weight > 0 or layer_distill > 0 else None,
            distill_weight=weight,
            layer_distill=layer_distill,
            layer_loss=str(finetune.layer_loss),
            **{key: float(getattr(finetune, key)) for key in ("temperature", "lr", "warmup")},
            **{key: bool(getattr(finetune, key)) for key in ("decay", "progress")},
            max_steps=finetune_steps(finetune, batches),
            lora_rank=None if rank is None else int(rank),
            lora_alpha=finetune.lora_alpha,
            seed=int(finetune.seed),
            accelerator="cpu" if device.type == "cpu" else "auto",
            precision=str(finetune.precision),
            logger=logger,
            log_prefix=f"recover/{label}",
            checkpoints=checkpoints,
            checkpoint_every=finetune.checkpoint_every,
        )
    finally:
        for parameter, flag in zip(teacher.parameters(), flags):
            parameter.requires_grad_(flag)


def control_model(task, rounds: list[list[dict]], finetune, logger, out=None) -> tuple[object, list[dict]]:
    """(a copy of the unpruned model fine-tuned like the pruned ones, each step's history), distilled from a frozen copy of it."""
    model = copy.deepcopy(task.model)
    teacher = copy.deepcopy(task.model).eval()
    history = []
    for number, batches in enumerate(rounds):
        label = "control" if len(rounds) == 1 else f"control/step{number + 1}"
        history += finetune_in_place(model, teacher, batches, finetune, logger, label, checkpoint_folder(out, label))
    return model, history


def finetune_record(history: list[dict]) -> dict:
    """What a point records of its fine-tune: each step's loss, the real tokens trained on and tokens per second of training."""
    tokens, seconds = sum(h["tokens"] for h in history), sum(h["seconds"] for h in history)
    return {
        "finetune_losses": [h["loss"] for h in history],
        "finetune_tokens": tokens,
        "finetune_tokens_per_s": tokens / seconds if seconds > 0 else None,
    }


def budget_info(finetune, rounds: list[list[dict]]) -> dict:
    """What a fine-tune trained on: rounds, steps, examples and real input tokens of each round."""
    return {
        "rounds": [
            {
                "steps": finetune_steps(finetune, batches),
                "batches": len(batches),
                "examples": sum(map(rows_of, batches)),
                "tokens": sum(map(batch_tokens, batches)),
            }
            for batches in rounds
        ]
    }
