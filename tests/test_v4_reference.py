"""headprune's head gates and physical pruning against transformers v4's head_mask and prune_heads, same weights.

The v4 outputs are in tests/fixtures/v4_reference.json, written once by tools/v4_reference.py in its own v4 venv;
the weights are rebuilt here from tools/v4_fixture_weights.py, the same pure function of (seed, name, shape).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import transformers
from v4_fixture_weights import fill_parameters, weights_digest

from headprune.core.attention.gates import HeadGates
from headprune.core.pruning import prune_mask

FIXTURE = Path(__file__).parent / "fixtures" / "v4_reference.json"
REFERENCE = json.loads(FIXTURE.read_text())
TOLERANCE = 1e-5  # relative to the largest |value| of the v4 output

# Names transformers v5 changed, mapped explicitly (none of the config keys used here changed).
V5_CONFIG_KEYS: dict[str, dict[str, str]] = {}  # model_type: {v4 config key: v5 key}
V5_CLASSES: dict[str, str] = {}  # v4 class name: v5 class name
_VIT_PARAMETERS = (  # (v5 state-dict name pattern, v4 name)
    (r"^layers\.(\d+)\.attention\.q_proj\.", r"encoder.layer.\1.attention.attention.query."),
    (r"^layers\.(\d+)\.attention\.k_proj\.", r"encoder.layer.\1.attention.attention.key."),
    (r"^layers\.(\d+)\.attention\.v_proj\.", r"encoder.layer.\1.attention.attention.value."),
    (r"^layers\.(\d+)\.attention\.o_proj\.", r"encoder.layer.\1.attention.output.dense."),
    (r"^layers\.(\d+)\.mlp\.fc1\.", r"encoder.layer.\1.intermediate.dense."),
    (r"^layers\.(\d+)\.mlp\.fc2\.", r"encoder.layer.\1.output.dense."),
    (r"^layers\.(\d+)\.layernorm_", r"encoder.layer.\1.layernorm_"),
)
V5_PARAMETERS: dict[str, tuple[tuple[str, str], ...]] = {"vit": _VIT_PARAMETERS, "deit": _VIT_PARAMETERS}

CASES = [(name, case) for name, entry in REFERENCE["models"].items() for case in entry["cases"]]


def v4_parameter_name(model_type: str, name: str) -> str:
    """The v4 state-dict name of a v5 parameter."""
    for pattern, v4_name in V5_PARAMETERS.get(model_type, ()):
        name = re.sub(pattern, v4_name, name)
    return name


def build_v5_model(name: str) -> torch.nn.Module:
    """The v5 model of one fixture row, from the same config, with the same fixture weights."""
    entry = REFERENCE["models"][name]
    renamed = V5_CONFIG_KEYS.get(entry["model_type"], {})
    config = transformers.AutoConfig.for_model(entry["model_type"], **{renamed.get(k, k): v for k, v in entry["config"].items()})
    model = getattr(transformers, V5_CLASSES.get(entry["v4_class"], entry["v4_class"]))(config).eval()
    names = {own: v4_parameter_name(entry["model_type"], own) for own, _ in model.named_parameters()}
    fill_parameters(model, REFERENCE["seed"], names)
    return model


def inputs_of(name: str) -> dict[str, torch.Tensor]:
    """The fixture's inputs as tensors (pixels float32, token ids and masks int64)."""
    inputs = REFERENCE["models"][name]["inputs"]
    return {k: torch.tensor(v, dtype=torch.float32 if k == "pixel_values" else torch.long) for k, v in inputs.items()}


def outputs_of(model, name: str) -> dict[str, torch.Tensor]:
    """The model's hidden states named as in the fixture."""
    with torch.no_grad():
        out = model(**inputs_of(name))
    return {key: getattr(out, key) for key in REFERENCE["models"][name]["unmasked"]}


def assert_matches_v4(actual: dict, expected: dict, what: str) -> None:
    """Every output within TOLERANCE of v4's, relative to the scale of v4's output."""
    for key, values in expected.items():
        reference = torch.tensor(values)
        scale = reference.abs().max().item()
        error = (actual[key] - reference).abs().max().item()
        assert error <= TOLERANCE * scale, f"{what}, {key}: max |v5 - v4| = {error:.3g}, scale {scale:.3g}"


def mask_of(name: str, case: str) -> dict[str, torch.Tensor]:
    """{group: [layers, heads]} of one case."""
    return {group: torch.tensor(mask) for group, mask in REFERENCE["models"][name]["cases"][case]["mask"].items()}


def test_fixture_is_small_and_from_v4():
    assert FIXTURE.stat().st_size < 1_000_000
    assert REFERENCE["transformers"].startswith("4.")
    pruned = [c for entry in REFERENCE["models"].values() for c in entry["cases"].values() if c["pruned"]]
    assert len(pruned) >= len(REFERENCE["models"])  # v4 pruned at least one case of every model


@pytest.mark.parametrize("name", list(REFERENCE["models"]))
def test_v5_rebuilds_the_v4_model(name):
    """Same parameter names (after the explicit renames), shapes, bits and unmasked outputs."""
    entry = REFERENCE["models"][name]
    model = build_v5_model(name)
    named = {v4_parameter_name(entry["model_type"], k): v for k, v in model.named_parameters()}
    assert {k: list(v.shape) for k, v in named.items()} == entry["parameters"]
    assert weights_digest(named) == entry["weights_sha256"]
    assert_matches_v4(outputs_of(model, name), entry["unmasked"], f"{name} unmasked")


@pytest.mark.parametrize(("name", "case"), CASES)
def test_gates_equal_v4_head_mask(name, case):
    model = build_v5_model(name)
    gates = HeadGates(model)
    with gates.masked(mask_of(name, case)):
        masked = outputs_of(model, name)
    assert_matches_v4(masked, REFERENCE["models"][name]["cases"][case]["masked"], f"{name} {case} masked")


@pytest.mark.parametrize(("name", "case"), CASES)
def test_pruning_equals_v4_prune_heads(name, case):
    """Against v4's prune_heads where v4 could prune the case, and always against v4's head_mask."""
    reference = REFERENCE["models"][name]["cases"][case]
    model = build_v5_model(name)
    prune_mask(model, mask_of(name, case))
    pruned = outputs_of(model, name)
    if reference["pruned"] is not None:
        assert_matches_v4(pruned, reference["pruned"], f"{name} {case} pruned ({reference['pruned_by']})")
    assert_matches_v4(pruned, reference["masked"], f"{name} {case} pruned, against v4's head_mask")
