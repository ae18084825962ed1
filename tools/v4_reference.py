"""Write transformers v4's head_mask and prune_heads outputs of small seeded models into a test fixture.

transformers v4 cannot be installed beside v5, so ``python tools/v4_reference.py`` creates (or reuses) its own
venv ``.venv-v4/`` with torch and the last transformers 4.x, and reruns itself there. Every parameter is
``tools/v4_fixture_weights.fixture_tensor(seed, name, shape)``, so tests/test_v4_reference.py rebuilds the same
weights on v5 without any weights in the repository. The fixture holds the configs, inputs, masks, outputs and
versions: tests/fixtures/v4_reference.json.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv-v4"
FIXTURE = ROOT / "tests" / "fixtures" / "v4_reference.json"
REQUIREMENTS = (("torch==2.13.0",), ("transformers==4.57.6",))  # torch first (CPU build); the last transformers 4.x
SEED = 0
HEADS = 4
TOKENS = [[5, 17, 42, 8, 23, 61], [9, 3, 77, 14, 50, 0]]  # the second example's last token is padding
ATTENTION = [[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0]]
DECODER_TOKENS = [[0, 12, 7, 33], [0, 4, 28, 19]]
TEXT = dict(vocab_size=99)
VISION = dict(image_size=16, patch_size=8, num_channels=3)

# name: (model_type, v4 class, config kwargs, groups: {group: (v4 mask argument, layers)})
MODELS = {
    "bert": (
        "bert",
        "BertModel",
        dict(TEXT, hidden_size=32, num_hidden_layers=3, num_attention_heads=HEADS, intermediate_size=64),
        {"enc_self": ("head_mask", 3)},
    ),
    "gpt2": (
        "gpt2",
        "GPT2Model",
        dict(TEXT, n_embd=32, n_layer=3, n_head=HEADS, n_positions=16, bos_token_id=0, eos_token_id=0),
        {"dec_self": ("head_mask", 3)},
    ),
    "distilbert": (
        "distilbert",
        "DistilBertModel",
        dict(TEXT, dim=32, n_layers=3, n_heads=HEADS, hidden_dim=64, max_position_embeddings=16),
        {"enc_self": ("head_mask", 3)},
    ),
    "vit": (
        "vit",
        "ViTModel",
        dict(VISION, hidden_size=32, num_hidden_layers=3, num_attention_heads=HEADS, intermediate_size=64),
        {"enc_self": ("head_mask", 3)},
    ),
    "deit": (
        "deit",
        "DeiTModel",
        dict(VISION, hidden_size=32, num_hidden_layers=3, num_attention_heads=HEADS, intermediate_size=64),
        {"enc_self": ("head_mask", 3)},
    ),
    "t5": (
        "t5",
        "T5Model",
        dict(TEXT, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2, num_heads=HEADS),
        {
            "enc_self": ("head_mask", 2),
            "dec_self": ("decoder_head_mask", 2),
            "enc_dec": ("cross_attn_head_mask", 2),
        },
    ),
}
# Kept heads per layer (cycled over layers), shifted by the group's index so groups differ.
CASES = {
    "emptied_layer": [[2], [], [0, 3]],  # one layer keeps a single head, one keeps none
    "uneven": [[1], [0, 1, 3], [2, 3]],  # every layer keeps at least one head
}
# v4's T5Attention.prune_heads fails when the first cross-attention layer loses a head (it builds a zero position
# bias of its pruned head count, then indexes it by original head id): one more case keeps that layer whole.
T5_CASE = "whole_first_cross_layer"
T5_NOTE = (
    "v4's T5Model.prune_heads fails (AttributeError: 'T5Stack' object has no attribute 'layer'): "
    "each attention module's own prune_heads (T5Attention.prune_heads) is called instead. That fails too when "
    "the first cross-attention layer loses a head (IndexError), hence the case whole_first_cross_layer."
)


def group_mask(case: str, group_index: int, layers: int) -> list[list[float]]:
    """[layers, heads] of 0/1: the case's kept heads, shifted by group_index."""
    kept = CASES[case]
    return [[1.0 if (h - group_index) % HEADS in kept[layer % len(kept)] else 0.0 for h in range(HEADS)] for layer in range(layers)]


def build_masks(groups: dict) -> dict[str, dict[str, list[list[float]]]]:
    """{case: {group: [layers, heads]}}."""
    masks = {case: {group: group_mask(case, index, layers) for index, (group, (_, layers)) in enumerate(groups.items())} for case in CASES}
    if "enc_dec" in groups:
        masks[T5_CASE] = {**masks["uneven"], "enc_dec": [[1.0] * HEADS] + masks["uneven"]["enc_dec"][1:]}
    return masks


def model_inputs(name: str, torch, fixture_tensor) -> dict:
    """The fixed inputs of one model, as tensors."""
    model_type = MODELS[name][0]
    if model_type in ("vit", "deit"):
        return {"pixel_values": fixture_tensor(SEED, "pixel_values", (2, VISION["num_channels"], 16, 16))}
    inputs = {"input_ids": torch.tensor(TOKENS), "attention_mask": torch.tensor(ATTENTION)}
    if model_type == "t5":
        inputs["decoder_input_ids"] = torch.tensor(DECODER_TOKENS)
    return inputs


def build_v4_model(name: str, transformers, fill_parameters):
    """The v4 model of one row, eager attention (v4's head_mask is exact there), seeded fixture weights."""
    model_type, class_name, kwargs, _ = MODELS[name]
    config = transformers.AutoConfig.for_model(model_type, **kwargs)
    config._attn_implementation = "eager"
    model = getattr(transformers, class_name)(config).eval()
    fill_parameters(model, SEED)
    return model


def outputs_of(model, inputs: dict, torch, **masks) -> dict[str, list]:
    """The model's hidden states under the given v4 mask arguments."""
    with torch.no_grad():
        out = model(**inputs, **masks)
    named = {"last_hidden_state": out.last_hidden_state}
    if getattr(out, "encoder_last_hidden_state", None) is not None:
        named["encoder_last_hidden_state"] = out.encoder_last_hidden_state
    return {key: value.tolist() for key, value in named.items()}


def removed_heads(mask: list[list[float]]) -> dict[int, list[int]]:
    """{layer: removed head ids} of a [layers, heads] mask, layers that lose nothing left out."""
    heads = {layer: [h for h, keep in enumerate(row) if keep == 0] for layer, row in enumerate(mask)}
    return {layer: ids for layer, ids in heads.items() if ids}


PRUNED_BY = {"t5": "T5Attention.prune_heads on each attention module"}  # else the model's own prune_heads


def prune_v4(model, model_type: str, mask: dict) -> None:
    """Prune with v4's own prune_heads (T5: each attention module's, as v4's T5Model.prune_heads fails)."""
    if model_type not in PRUNED_BY:
        model.prune_heads(removed_heads(next(iter(mask.values()))))
        return
    modules = {
        "enc_self": lambda i: model.encoder.block[i].layer[0].SelfAttention,
        "dec_self": lambda i: model.decoder.block[i].layer[0].SelfAttention,
        "enc_dec": lambda i: model.decoder.block[i].layer[1].EncDecAttention,
    }
    for group, group_mask_ in mask.items():
        for layer, heads in removed_heads(group_mask_).items():
            modules[group](layer).prune_heads(heads)


def reference_of(name: str, torch, transformers, weights) -> dict:
    """Configs, inputs, masks and v4 outputs (unmasked, head_mask, prune_heads) of one model."""
    model_type, class_name, kwargs, groups = MODELS[name]
    inputs = model_inputs(name, torch, weights.fixture_tensor)
    model = build_v4_model(name, transformers, weights.fill_parameters)
    entry = {
        "model_type": model_type,
        "v4_class": class_name,
        "config": kwargs,
        "attn_implementation": "eager",
        "parameters": {key: list(value.shape) for key, value in model.named_parameters()},
        "weights_sha256": weights.weights_digest(dict(model.named_parameters())),
        "inputs": {key: value.tolist() for key, value in inputs.items()},
        "mask_arguments": {group: argument for group, (argument, _) in groups.items()},
        "unmasked": outputs_of(model, inputs, torch),
        "cases": {},
    }
    if model_type == "t5":
        entry["note"] = T5_NOTE
    for case, mask in build_masks(groups).items():
        arguments = {groups[group][0]: torch.tensor(value) for group, value in mask.items()}
        result = {
            "mask": mask,
            "masked": outputs_of(model, inputs, torch, **arguments),
            "pruned_by": PRUNED_BY.get(model_type, "model.prune_heads"),
            "pruned": None,
        }
        pruned = build_v4_model(name, transformers, weights.fill_parameters)
        try:
            prune_v4(pruned, model_type, mask)
            result["pruned"] = outputs_of(pruned, inputs, torch)
        except Exception as error:  # v4 itself cannot run some pruned shapes (an emptied layer): record why
            result["prune_error"] = f"{type(error).__name__}: {error}"
        entry["cases"][case] = result
    return entry


def write_fixture(fixture: dict) -> None:
    """JSON with 9 significant digits (exact for float32) and one line per innermost list."""
    text = json.dumps(_rounded(fixture), indent=1)
    text = re.sub(r"\[\s+([^\[\]{}\"]*?)\s+\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text)
    FIXTURE.parent.mkdir(parents=True, exist_ok=True)
    FIXTURE.write_text(text + "\n")


def _rounded(value):
    if isinstance(value, float):
        return float(f"{value:.9g}")
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def generate() -> None:
    """Inside the v4 venv: build every model and write the fixture."""
    import torch
    import transformers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import v4_fixture_weights as weights

    torch.set_num_threads(1)
    fixture = {
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "weights": "tools/v4_fixture_weights.py: fixture_tensor(seed, v4 parameter name, shape)",
        "generated_by": "python tools/v4_reference.py",
        "models": {name: reference_of(name, torch, transformers, weights) for name in MODELS},
    }
    write_fixture(fixture)
    print(f"wrote {FIXTURE.relative_to(ROOT)} ({FIXTURE.stat().st_size} bytes, transformers {transformers.__version__})")


def ensure_venv() -> Path:
    """The v4 venv's python, created and installed when missing (at the lowest CPU priority)."""
    python = VENV / "bin" / "python"
    if not python.exists():
        venv.create(VENV, with_pip=True)
    check = "import transformers, torch; assert transformers.__version__.startswith('4.')"
    if subprocess.run([str(python), "-c", check], capture_output=True).returncode != 0:
        for requirement in REQUIREMENTS:
            subprocess.run(["nice", "-n", "19", str(python), "-m", "pip", "install", "-q", *requirement], check=True)
    return python


def main() -> None:
    """Rerun inside the v4 venv unless already there."""
    try:
        import transformers

        inside = transformers.__version__.startswith("4.")
    except ImportError:
        inside = False
    if inside:
        generate()
    else:
        python = ensure_venv()
        subprocess.run([str(python), str(Path(__file__).resolve())], check=True)


if __name__ == "__main__":
    main()
