"""ONNX export of any (pruned) model: encoders, decoders and encoder-decoders, uneven heads included."""

import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from headprune.core.inputs import ENCODER_INPUTS
from headprune.export.onnx_dir import DESCRIPTION, copy_onnx_dir

EXPORTER = {"dynamo": False, "opset_version": 17, "do_constant_folding": True}  # the TorchScript exporter


class _Output(nn.Module):
    """module(**named inputs).<output> with positional inputs (the TorchScript exporter's calling convention)."""

    def __init__(self, module: nn.Module, names: list[str], extra: dict, output: str = "logits"):
        super().__init__()
        self.module, self.names, self.extra, self.output = module, names, extra, output

    def forward(self, *tensors):
        return getattr(self.module(**dict(zip(self.names, tensors)), **self.extra), self.output)


class _Decoder(nn.Module):
    """One decoder pass over all target positions (no cache) given the encoder's states (and the source mask, if any)."""

    def __init__(self, model: nn.Module, names: list[str]):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, decoder_input_ids, encoder_hidden_states, *source):
        extra = dict(zip(self.names, source))
        if not source:  # a full target mask: without one transformers looks for packed sequences with aten::diff (no ONNX op)
            extra["decoder_attention_mask"] = torch.ones_like(decoder_input_ids)
        return self.model(encoder_outputs=(encoder_hidden_states,), decoder_input_ids=decoder_input_ids, use_cache=False, **extra).logits


def _export(module: nn.Module, batch: dict, path: Path, output: str, axes: dict) -> Path:
    """Trace ``module`` on the ``batch`` inputs ``axes`` names (every key but ``output``, in order) into ``path``."""
    inputs = [name for name in axes if name != output]
    module.eval()  # the exporter restores the wrapper's mode afterwards, recursively: a training-mode wrapper would leave dropout on
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript tracer's notes on Python booleans and the exporter's deprecation
        args = tuple(batch[name] for name in inputs)
        torch.onnx.export(module, args, str(path), input_names=inputs, output_names=[output], dynamic_axes=axes, **EXPORTER)
    return path


def feature_input(model: nn.Module, batch: dict) -> str | None:
    """The model's main input when it is a float tensor of fixed shape past the batch (pixels, audio features), else None."""
    name = getattr(model, "main_input_name", "input_ids")
    value = batch.get(name)
    return name if torch.is_tensor(value) and value.is_floating_point() else None


def padded(batch: dict) -> dict:
    """``batch`` with one padded position (mask 0) appended to every row of the source inputs."""
    return {k: F.pad(v, (0, 1)) if k in ENCODER_INPUTS else v for k, v in batch.items()}  # (B, T) -> (B, T + 1), zeros


def export_onnx(model: nn.Module, batch: dict, out: Path) -> dict[str, Path]:
    """Write the model's graph(s) into ``out`` traced on ``batch`` (model inputs, CPU; padding added); {graph name: file}."""
    out.mkdir(parents=True, exist_ok=True)
    model = model.eval().cpu()
    batch = padded({k: v.cpu() for k, v in batch.items()})
    with torch.no_grad():
        if getattr(model.config, "is_encoder_decoder", False):
            return _export_encoder_decoder(model, batch, out)
        features = feature_input(model, batch)  # the graph takes float features alone, else the token inputs
        if not features and "input_ids" not in batch:
            raise ValueError(
                f"an ONNX export needs input_ids (or the model's float {model.main_input_name}) in the check batch; it has {sorted(batch)}"
            )
        names = [features] if features else [k for k in ENCODER_INPUTS if k in batch]
        extra = {"use_cache": False} if model.can_generate() else {}  # a decoder-only LM: every position, no cache
        axes = {name: {0: "batch"} if name == features else {0: "batch", 1: "sequence"} for name in names}
        axes["logits"] = {0: "batch", 1: "sequence"} if model.can_generate() else {0: "batch"}
        return {"model": _export(_Output(model, names, extra), batch, out / "model.onnx", "logits", axes)}


def _export_encoder_decoder(model: nn.Module, batch: dict, out: Path) -> dict[str, Path]:
    """``encoder.onnx`` (source inputs -> last_hidden_state) and ``decoder.onnx`` (target ids, encoder states[, source mask] -> logits)."""
    features = feature_input(model, batch)  # Whisper: (batch, mel bins, frames), the frame count fixed by the model; no source mask
    speech = features is not None
    names = [features] if speech else ["input_ids", "attention_mask"]
    source = {0: "batch"} if speech else {0: "batch", 1: "source"}
    encode = _Output(model.get_encoder(), names, {}, "last_hidden_state")  # source inputs (token ids and mask, or features)
    encoder_axes = {**dict.fromkeys(names, source), "last_hidden_state": source}
    encoder = _export(encode, batch, out / "encoder.onnx", "last_hidden_state", encoder_axes)
    masks = [] if speech else ["attention_mask"]
    target = {0: "batch", 1: "target"}
    decoder_axes = {"decoder_input_ids": target, "encoder_hidden_states": source, **dict.fromkeys(masks, source), "logits": target}
    hidden = encode(*(batch[n] for n in names))
    decoder = _export(_Decoder(model, masks), {**batch, "encoder_hidden_states": hidden}, out / "decoder.onnx", "logits", decoder_axes)
    return {"encoder": encoder, "decoder": decoder}


def quantize_int8(files: dict[str, Path], out: Path, per_channel: bool = True) -> dict[str, Path]:
    """Dynamic int8 quantisation of every graph (weights int8, activations quantised at run time) into ``out``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.quantization.shape_inference import quant_pre_process

    out.mkdir(parents=True, exist_ok=True)
    done = {}
    for name, path in files.items():
        target = out / Path(path).name
        prepared = out / f"{Path(path).stem}.prepared.onnx"
        # ONNX shape inference and graph clean-up, as ONNX Runtime recommends
        quant_pre_process(str(path), str(prepared), skip_symbolic_shape=True)
        quantize_dynamic(str(prepared), str(target), per_channel=per_channel, weight_type=QuantType.QInt8)
        prepared.unlink()
        done[name] = target
    source = Path(next(iter(files.values()))).parent
    if (source / DESCRIPTION).is_file():  # an export directory: the int8 one gets its config, tokenizer and description too
        weights = "per-channel" if per_channel else "per-tensor"
        copy_onnx_dir(source, out, done, f"int8 ({weights} weights; activations quantised per batch at run time)")
    return done
