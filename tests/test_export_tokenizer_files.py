"""Tokenizers of hf and deci_hf exports load in transformers 5 and, where ``.venv-v4`` is built, in transformers 4."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from headprune.export.tokenizer_files import PORTABLE_CLASS, save_tokenizer

ROOT = Path(__file__).resolve().parents[1]
V4_PYTHON = ROOT / ".venv-v4" / "bin" / "python"  # tools/v4_reference.py builds it (torch and transformers 4.57)
V4_BUILT = any((ROOT / ".venv-v4").glob("lib/*/site-packages/transformers-4.*.dist-info"))
TEXTS = ["the cat sat on the red mat", "a dog near town"]


@pytest.fixture(scope="module", params=["trained", "smollm2"])
def saved(tmp_path_factory, request):
    """A tokenizer (a trained BPE with a prefix space, SmolLM2's) saved as the exports save it, and the ids transformers 5
    gives the texts before saving."""
    from transformers import AutoTokenizer

    from headprune.models.embedded import embedded_model_dir
    from headprune.models.tokenizers import train_tokenizer

    if request.param == "smollm2":
        tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir("smollm2"))
    else:
        tokenizer = train_tokenizer([f"the {w} sat on the red mat near town" for w in ("cat", "dog")] * 10, vocab_size=300)
    out = tmp_path_factory.mktemp("tokenizer")
    save_tokenizer(tokenizer, out)
    return out, [tokenizer(t, add_special_tokens=False)["input_ids"] for t in TEXTS]


def test_the_config_names_the_class_both_versions_have(saved):
    out, _ = saved
    config = json.loads((out / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == PORTABLE_CLASS and "backend" not in config


def test_transformers_5_loads_it_with_the_same_ids(saved):
    from transformers import AutoTokenizer

    out, ids = saved
    loaded = AutoTokenizer.from_pretrained(out)
    assert [loaded(t, add_special_tokens=False)["input_ids"] for t in TEXTS] == ids


@pytest.mark.skipif(not V4_BUILT, reason="no .venv-v4 (python tools/v4_reference.py builds it)")
def test_transformers_4_loads_it_with_the_same_ids(saved):
    out, ids = saved
    code = (
        "import json, sys, transformers; from transformers import AutoTokenizer; "
        f"t = AutoTokenizer.from_pretrained({str(out)!r}); "
        f"print(json.dumps([transformers.__version__, type(t).__name__, [t(x, add_special_tokens=False)['input_ids'] for x in {TEXTS!r}]]))"
    )
    done = subprocess.run([str(V4_PYTHON), "-I", "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    version, name, got = json.loads(done.stdout.strip().splitlines()[-1])
    assert version.startswith("4.") and name == PORTABLE_CLASS and got == ids
