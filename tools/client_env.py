"""The clients' own environment for ``make test-clients``: a venv under ``.clients/`` without headprune.

It holds stock transformers (the CPU build of torch) and llama.cpp's Python bindings compiled for the CPU from the
``llama-cpp-python`` sources on PyPI (its vendored llama.cpp); lm-evaluation-harness is added when it installs.
Built once (about 10 minutes on 2 cores) and reused: a stamp file records what was installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_CPP_PYTHON = "0.3.36"  # the sdist whose vendored llama.cpp the deci files were tried with
# llama.cpp as a shared library for the bindings only: no tools, tests, examples, server or multimodal library.
CMAKE_ARGS = "-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"


def pinned(package: str) -> str:
    """``package==version`` from constraints.txt (the tested versions), or the bare name."""
    text = (ROOT / "constraints.txt").read_text(encoding="utf-8")
    found = re.search(rf"^{re.escape(package)}==(\S+)$", text, flags=re.MULTILINE | re.IGNORECASE)
    return f"{package}=={found.group(1)}" if found else package


def _run(command: list[str], **env) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, **env})


def python_of(clients: Path) -> Path:
    """The clients venv's interpreter."""
    return clients / "venv" / "bin" / "python"


def ensure_env(clients: Path, with_lm_eval: bool = True) -> dict:
    """Create or reuse the clients venv; {"python": path, "lm_eval": bool}: whether lm-eval is installed in it."""
    python = python_of(clients)
    stamp = clients / "venv" / f".ready-{LLAMA_CPP_PYTHON}"
    if not stamp.exists():
        if not python.exists():
            _run([sys.executable if not hasattr(sys, "_base_executable") else sys._base_executable, "-m", "venv", str(clients / "venv")])
        pip = [str(python), "-m", "pip", "install", "-q"]
        _run(pip + ["--upgrade", "pip"])
        _run(pip + [pinned("torch")])  # the CPU build, as make venv installs it
        _run(pip + [pinned(p) for p in ("transformers", "tokenizers", "safetensors", "numpy", "huggingface_hub")])
        _run(
            pip + ["--no-binary", "llama-cpp-python", f"llama-cpp-python=={LLAMA_CPP_PYTHON}"],
            CMAKE_ARGS=CMAKE_ARGS,
            CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1),
        )
        stamp.write_text("torch transformers llama-cpp-python\n", encoding="utf-8")
    lm_eval = clients / "venv" / ".lm-eval"
    if with_lm_eval and not lm_eval.exists() and not (clients / "venv" / ".lm-eval-failed").exists():
        try:
            _run([str(python), "-m", "pip", "install", "-q", "lm-eval", pinned("accelerate")])
            lm_eval.write_text("lm-eval accelerate\n", encoding="utf-8")
        except subprocess.CalledProcessError:
            (clients / "venv" / ".lm-eval-failed").write_text("pip could not install lm-eval\n", encoding="utf-8")
    return {"python": python, "lm_eval": lm_eval.exists()}


if __name__ == "__main__":
    print(ensure_env(ROOT / ".clients"))
