"""What an export must reproduce: the pruned copy it is written from, and the masked model's outputs with their f32 round-off."""

import copy
from dataclasses import dataclass

import numpy as np
from torch import nn

from headprune.core.units import model_gates, prune_unit_mask, unit_gates
from headprune.export import FORMATS
from headprune.export.verify import (
    ROUNDOFF_MULTIPLE,
    eos_and_pad,
    exact_logits,
    f32_roundoff,
    greedy_prompt,
    greedy_tokens,
    is_decoder_lm,
    reference_logits,
)


@dataclass
class Reference:
    """The model the export must reproduce, its logits and greedy tokens, and the f32 round-off measured on it."""

    model: nn.Module
    logits: list[np.ndarray]
    greedy: tuple | None  # (prompt, tokens, eos, pad, new tokens) for a decoder-only LM
    roundoff: float  # largest |f32 - float64| logits of the reference and of the pruned copy
    masked_logits: list[np.ndarray] | None = None  # f16 GGUF: the masked f32 model's, beside the rounded reference


def pruned_copy(task, mask):
    """A CPU copy of the task's model with ``mask``'s heads removed (None: as it is), running its own attention."""
    pruned = copy.deepcopy(task.model).cpu()
    if mask is not None:
        prune_unit_mask(unit_gates(pruned, task.gates.unit), mask)
    model_gates(pruned).remove()  # the model's own attention (the wrapper stays only where uneven KV groups need it)
    return pruned


def _on_device(model: nn.Module, batches: list[dict]) -> list[dict]:
    device = next(model.parameters()).device
    return [{k: v.to(device) for k, v in b.items()} for b in batches]


def reference_outputs(task, pruned: nn.Module, mask, batches: list[dict], settings, suppress: list[int] | None = None) -> Reference:
    """The masked task model's logits and greedy tokens on ``batches`` (never a ``suppress`` id), and the f32 round-off against float64."""
    rounded = FORMATS[str(settings.format)].rounds_weights and str(settings.gguf_dtype) == "f16"
    if rounded:
        from headprune.export.gguf import rounded_like_gguf

        model = rounded_like_gguf(pruned, "f16")  # the weights as the file stores them
    else:
        model = task.model  # under the mask
    with task.gates.masked(None if rounded else mask):
        logits = reference_logits(model, _on_device(model, batches))
        greedy = None
        if is_decoder_lm(pruned):
            prompt, eos_pad, new = greedy_prompt(batches), eos_and_pad(pruned), int(settings.new_tokens)
            greedy = (prompt, greedy_tokens(model, prompt, new, suppress), *eos_pad, new)
        masked = None
        if rounded:  # how far the rounded weights move the logits from the masked f32 model
            with task.gates.masked(mask):
                masked = reference_logits(task.model, _on_device(task.model, batches))
    source = model if rounded else pruned  # the same function as the reference, in float64
    computed = [logits] if rounded else [logits, reference_logits(pruned, batches)]
    return Reference(model, logits, greedy, f32_roundoff(computed, exact_logits(source, batches)), masked)


def check_fields(pruned: nn.Module, reference: Reference, pre: dict | None) -> dict:
    """What the checker needs beside the export: the f32 round-off and its multiple, whether to score perplexity, the GGUF pre-tokenizer."""
    fields = {"f32_roundoff": reference.roundoff, "roundoff_multiple": ROUNDOFF_MULTIPLE, "causal": is_decoder_lm(pruned)}
    return fields if pre is None else {**fields, "tokenizer_pre": pre["name"]}
