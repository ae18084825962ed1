"""Layer-wise hidden-state distillation (CoFi): each kept layer's output matched to its original layer's in the teacher."""

from dataclasses import dataclass

import torch
from torch import nn

from headprune.core.hidden.sites import IDS_ATTR
from headprune.core.inputs import decoder_valid
from headprune.core.layer.removal import REMOVED_ATTR

STACK_OUTPUTS = {"encoder_hidden_states": "enc_layer", "decoder_hidden_states": "dec_layer", "hidden_states": None}  # None: the one stack


@dataclass(frozen=True)
class LayerTargets:
    """What pairs a student's hidden states with its teacher's: each side's removed layers and the student's channels in the teacher."""

    student_removed: dict  # {layer group: [removed original layer ids]}
    teacher_removed: dict
    channels: torch.Tensor | None  # the teacher positions of the student's residual channels (None: the same channels)


def channel_index(student: nn.Module, teacher: nn.Module) -> torch.Tensor | None:
    """Teacher positions of the student's residual channels (by original id) when they differ, else None."""
    books = [getattr(model, IDS_ATTR, None) for model in (student, teacher)]  # {"ids": original ids of the channels present}
    ids, teacher_ids = (list(book["ids"]) if book is not None else None for book in books)
    if ids is None or ids == teacher_ids or (teacher_ids is None and ids == list(range(len(ids)))):
        return None
    position = {c: k for k, c in enumerate(teacher_ids)} if teacher_ids is not None else {c: c for c in ids}
    missing = [c for c in ids if c not in position]
    if missing:
        raise ValueError(f"the student keeps residual channels {missing[:5]} that its teacher has removed: no hidden state to match")
    return torch.tensor([position[c] for c in ids], dtype=torch.long)


def layer_targets(student: nn.Module, teacher: nn.Module) -> LayerTargets:
    """The layer and channel correspondence of a (pruned) student and its teacher, read from their records."""
    removed = [dict(getattr(model.config, REMOVED_ATTR, None) or {}) for model in (student, teacher)]  # the layer removal's records
    return LayerTargets(*removed, channel_index(student, teacher))


def _originals(layers: int, removed: dict, group: str | None) -> list[int]:
    """Original ids of a stack's ``layers`` present layers, given the removed-layers record."""
    gone = {int(i) for i in (removed.get(group, []) if group is not None else [i for ids in removed.values() for i in ids])}
    return [i for i in range(layers + len(gone)) if i not in gone]


def layer_pairs(student_layers: int, teacher_layers: int, targets: LayerTargets, group: str | None) -> list[tuple[int, int]]:
    """[(student hidden-state index, teacher hidden-state index)] of one stack (index l + 1: layer l's output): each kept layer
    with its original layer in the teacher, the last output (after a pre-norm model's final norm) with the teacher's last."""
    student = _originals(student_layers, targets.student_removed, group)
    teacher = _originals(teacher_layers, targets.teacher_removed, group)
    lost = [original for original in student[:-1] if original not in teacher]
    if lost:
        raise ValueError(f"the student keeps layer {lost[0]} of its {group or 'only'} stack, which its teacher has removed")
    pairs = [(position + 1, teacher.index(original) + 1) for position, original in enumerate(student[:-1])]
    return pairs + [(len(student), teacher_layers)] if student else []


def _token_mask(batch: dict, name: str, hidden: torch.Tensor) -> torch.Tensor | None:
    """(B, T) bool mask of the real tokens of one stack's hidden states (None: every position is real)."""
    mask = decoder_valid(batch) if name == "decoder_hidden_states" else batch.get("attention_mask")
    if mask is None or tuple(mask.shape) != tuple(hidden.shape[:2]):
        return None
    return mask.to(hidden.device).bool()


def normalised_mse(student: torch.Tensor, teacher: torch.Tensor, valid: torch.Tensor | None = None, per_token=False) -> torch.Tensor:
    """mean((s - t)^2) / mean(t^2) over the ``valid`` (B, T) tokens of two (B, T, D) hidden states (1 = s of 0); ``per_token``: mean of |s - t|^2 / |t|^2."""
    if valid is not None:
        student, teacher = student[valid], teacher[valid]  # (N, D)
    teacher, tiny = teacher.float(), torch.finfo(torch.float32).tiny
    if per_token:
        return ((student.float() - teacher).pow(2).sum(-1) / teacher.pow(2).sum(-1).clamp_min(tiny)).mean()
    return (student.float() - teacher).pow(2).mean() / teacher.pow(2).mean().clamp_min(tiny)


def layer_distillation_loss(student_outputs, teacher_outputs, batch: dict, targets: LayerTargets, per_token: bool = False) -> torch.Tensor:
    """Mean over the student's layers (every stack) of the normalised MSE of its output to its teacher layer's, at real tokens
    and kept channels (outputs of forwards with ``output_hidden_states=True``; 0 = the teacher's states, 1 = states of 0)."""
    terms = []
    for name, group in STACK_OUTPUTS.items():
        student, teacher = student_outputs.get(name), teacher_outputs.get(name)
        if student is None or teacher is None:
            continue
        valid = _token_mask(batch, name, student[0])
        for s, t in layer_pairs(len(student) - 1, len(teacher) - 1, targets, group):
            wanted = teacher[t] if targets.channels is None else teacher[t].index_select(-1, targets.channels.to(teacher[t].device))
            terms.append(normalised_mse(student[s], wanted, valid, per_token))
    if not terms:
        raise ValueError("layer distillation needs hidden states, and the model's outputs have none (output_hidden_states=True)")
    return torch.stack(terms).mean()
