"""llama.cpp's GELU as its CPU backend computes it, for the references of the GELU families' checks.

ggml (GGML_GELU_FP16, ggml-cpu/vec.h) computes GELU through a float16 table: an input x in (-10, 10) is rounded to
float16 and the tanh GELU of that float16 value, stored in float16, is read back; x <= -10 gives 0, x >= 10 gives x. Each
activation is thereby off by up to about one float16 step (2^-11 of it), and models whose norms follow the FFN (Gemma's
post-FFN norm) carry that error into the logits at full scale: on the tiny Gemma 3 (weights x4) of clients/family_jobs.py
its log-probs move by 1.3e-3 (unpruned) and 5.0e-3 nats (uniform), beyond the f32 tolerance of 1e-3. The check computes
this table effect per case (the masked model with this GELU against the exact one) and adds it to the tolerance; llama.cpp
against the masked model with this GELU agrees within the f32 tolerance (measured: log-probs within 9e-5 nats, Gemma 3
uniform; 2e-5 or less elsewhere), so the sum bounds what a correct file may differ by (triangle inequality).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import torch


def ggml_gelu(x: torch.Tensor) -> torch.Tensor:
    """GELU through ggml's float16 table: the tanh GELU of x rounded to float16, rounded to float16; exact past |x| >= 10."""
    x32 = x.float()
    h = x32.half().float()  # the table's index: x as float16
    table = (0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * h * (1 + 0.044715 * h * h)))).half().float()
    return torch.where(x32 <= -10, torch.zeros_like(x32), torch.where(x32 >= 10, x32, table)).to(x.dtype)


@contextmanager
def llama_cpp_gelu(model):
    """The model's GELU activations (transformers' GELU modules: Gemma's tanh GELU, Pythia's exact one) computed as ggml's table."""
    modules = [m for m in model.modules() if "gelu" in type(m).__name__.lower()]
    if not modules:
        raise ValueError(f"{type(model).__name__} holds no GELU activation module: its table effect cannot be computed")
    for module in modules:
        module.forward = ggml_gelu  # an instance attribute over the class's forward; hooks on the module still run
    try:
        yield
    finally:
        for module in modules:
            del module.forward


def log_probs(rows: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """Teacher-forced log p of each next token of ``prompt`` (float64), rows[t] predicting token t + 1."""
    rows = rows[: len(prompt) - 1].astype(np.float64)
    top = rows.max(axis=-1, keepdims=True)
    normalised = rows - top - np.log(np.exp(rows - top).sum(axis=-1, keepdims=True))
    return normalised[np.arange(len(prompt) - 1), prompt[1:]]


def table_effect(model, gates, mask, arrays: dict) -> dict:
    """How far ggml's GELU table moves the masked model on the job's prompts: {"gelu_table_logits": max |logits| difference,
    "gelu_table_logprobs": max |log p| difference (nats)} of the masked model with that GELU against ``arrays`` (exact)."""
    from clients.cases import masked_outputs

    prompts = [arrays[f"prompt{i}"].tolist() for i in range(sum(k.startswith("prompt") for k in arrays))]
    with llama_cpp_gelu(model):
        table = masked_outputs(model, gates, mask, prompts, 0)
    logits = max(float(np.abs(table[f"reference{i}"] - arrays[f"reference{i}"]).max()) for i in range(len(prompts)))
    logprobs = max(
        float(
            np.abs(log_probs(table[f"reference{i}"], arrays[f"prompt{i}"]) - log_probs(arrays[f"reference{i}"], arrays[f"prompt{i}"])).max()
        )
        for i in range(len(prompts))
    )
    return {"gelu_table_logits": logits, "gelu_table_logprobs": logprobs}
