"""An ONNX Runtime export seen as the HF model it came from, so that tasks evaluate and time it unchanged."""

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch import nn

from headprune.export.checker import OnnxRunner
from headprune.export.onnx import export_onnx

INPUTS = ("input_ids", "attention_mask", "token_type_ids", "decoder_input_ids")


class OnnxRuntimeModel(nn.Module):
    """ONNX Runtime sessions of one export behind the HF call convention (logits only)."""

    def __init__(self, files: dict, config, threads: int = 1, main_input_name: str = "input_ids"):
        super().__init__()
        self.main_input_name = main_input_name  # as the exported model's (HF's name for its first input)
        self.runner = OnnxRunner({name: str(path) for name, path in files.items()}, threads)
        self.config = config
        self.anchor = nn.Parameter(torch.zeros(1), requires_grad=False)  # device of the outputs (CPU)

    def forward(self, **inputs):
        arrays = {  # token ids int64; the main input, where it is no token input, float32 (pixels, audio features)
            k: np.ascontiguousarray(v.detach().cpu().numpy().astype(np.int64 if k in INPUTS else np.float32))
            for k, v in inputs.items()
            if (k in INPUTS or k == self.main_input_name) and torch.is_tensor(v)
        }
        logits = torch.from_numpy(self.runner.logits(arrays))
        return SimpleNamespace(logits=logits, last_hidden_state=logits)  # the output embedding is the identity

    @property
    def base_model(self) -> nn.Module:
        """The model itself: its ``last_hidden_state`` is the logits (the output embedding is the identity)."""
        return self

    def get_output_embeddings(self) -> nn.Module:
        return nn.Identity()

    def generate(self, *args, **kwargs):
        raise NotImplementedError("generation through ONNX Runtime needs an export with a KV cache; these graphs have none")


def onnx_runtime_models(models: dict, example: dict, out, threads: int = 1) -> dict:
    """{name: OnnxRuntimeModel} of each model exported to ONNX into ``out/<name>`` (traced on ``example``)."""
    return {
        name: OnnxRuntimeModel(export_onnx(model, example, Path(out) / name), model.config, threads, model.main_input_name)
        for name, model in models.items()
    }
