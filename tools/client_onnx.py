"""The ONNX export in the client people run: plain ONNX Runtime and tokenizers, in a venv that has nothing else.

    python tools/client_onnx.py [--dir .clients/onnx] [--optimum]        (exit 0 when every check passes)

Creates ``<dir>/venv`` (reused on the next run) with only onnxruntime, tokenizers and numpy (the versions of
constraints.txt), prunes the embedded MiniLM (as a 3-way NLI classifier, a seeded uneven mask), exports it with
``export.format=onnx`` into ``<dir>/minilm-pruned`` (and its int8 version), and runs
``headprune/export/onnx_client.py`` in that venv on raw sentence pairs: its token ids, logits and labels against the
masked model's in PyTorch. The int8 directory is opened too (its labels are counted against f32, not required equal). ``--optimum`` also opens
the directory with optimum's ``ORTModelForSequenceClassification`` (tools/client_optimum.py) in ``<dir>/optimum-venv``:
optimum-onnx 0.1 pins transformers < 4.58, so it cannot share a venv with headprune.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import venv
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from client_env import ROOT, pinned  # noqa: E402

PACKAGES = ("onnxruntime", "tokenizers", "numpy")
OPTIMUM = "optimum-onnx[onnxruntime]==0.1.0"
PAIRS = [
    ["A man is eating pizza in the park.", "Someone eats."],
    ["Two dogs run on the beach.", "The animals are asleep indoors."],
    ["A woman reads a book on a train.", "A woman is travelling."],
    ["The children are playing football after school.", "Kids play a sport."],
    ["A chef cooks pasta in a busy kitchen.", "Nobody is cooking."],
    ["The museum opens at nine every morning.", "The museum is popular with tourists."],
]


def client_python(folder: Path) -> str:
    """The venv's interpreter, created with onnxruntime, tokenizers and numpy on first use."""
    python = folder / "venv" / "bin" / "python"
    if not python.is_file():
        venv.EnvBuilder(with_pip=True, clear=True).create(folder / "venv")
    ready = subprocess.run([str(python), "-c", "import onnxruntime, tokenizers, numpy"], capture_output=True).returncode == 0
    if not ready:
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *map(pinned, PACKAGES)], check=True)
    extra = subprocess.run([str(python), "-c", "import torch"], capture_output=True).returncode == 0
    if extra:
        raise RuntimeError(f"{folder / 'venv'} can import torch: remove it and run again")
    return str(python)


def optimum_python(folder: Path) -> str:
    """A second venv with optimum-onnx 0.1 (which pins transformers < 4.58), torch and onnxruntime, created on first use."""
    python = folder / "optimum-venv" / "bin" / "python"
    if not python.is_file():
        venv.EnvBuilder(with_pip=True, clear=True).create(folder / "optimum-venv")
    if subprocess.run([str(python), "-c", "import optimum.onnxruntime"], capture_output=True).returncode != 0:
        packages = [pinned("torch"), pinned("onnxruntime"), OPTIMUM, "transformers<4.58"]
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *packages], check=True)
    return str(python)


def pruned_minilm(seed: int = 0):
    """(the embedded MiniLM as an NLI classifier with head gates, a seeded uneven mask of about half its heads, the pruned copy, tokenizer)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from headprune.core.gates import HeadGates
    from headprune.core.pruning import prune_mask
    from headprune.models.sources import resolve_pretrained

    path = resolve_pretrained("minilm")
    torch.manual_seed(seed)
    model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=3).eval()
    labels = ("entailment", "neutral", "contradiction")
    model.config.id2label, model.config.label2id = dict(enumerate(labels)), {name: i for i, name in enumerate(labels)}
    gates = HeadGates(model)
    mask = gates.ones()
    generator = torch.Generator().manual_seed(seed)
    for values in mask.values():
        layers, heads = values.shape
        values.view(-1)[torch.randperm(layers * heads, generator=generator)[: layers * heads // 2]] = 0.0  # uneven per layer
    pruned = copy.deepcopy(model)
    gates.remove()
    prune_mask(pruned, mask)
    HeadGates(pruned).remove()
    return model, mask, pruned, AutoTokenizer.from_pretrained(path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=str(ROOT / ".clients" / "onnx"), help="where the venv and the export go")
    parser.add_argument("--optimum", action="store_true", help=f"also open the directory with {OPTIMUM} in a venv of its own")
    args = parser.parse_args()
    folder = Path(args.dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    python = client_python(folder)

    from headprune.core.gates import HeadGates
    from headprune.export import export_model
    from headprune.export.onnx import quantize_int8
    from headprune.export.onnx_dir_check import compare_predictions, masked_predictions, run_client

    model, mask, pruned, tokenizer = pruned_minilm()
    out = folder / "minilm-pruned"
    example = dict(tokenizer(*zip(*PAIRS[:2]), padding=True, return_tensors="pt"))
    graphs = export_model("onnx", pruned, tokenizer, out, example)["graphs"]
    quantize_int8(graphs, out / "int8")
    description = json.loads((out / "headprune_export.json").read_text())
    gates = HeadGates(model)
    with gates.masked(mask):
        reference = masked_predictions(model, tokenizer, PAIRS, description)
    answer = run_client(out, PAIRS, python=python)
    report = compare_predictions(answer, reference)
    int8 = run_client(out / "int8", PAIRS, python=python)
    report["int8_labels_equal_f32"] = sum(a == b for a, b in zip(int8["labels"], answer["labels"]))
    report["examples"] = len(PAIRS)
    report["heads_per_layer"] = description["heads_per_layer"]
    report["client"] = f"{python} -I (onnxruntime, tokenizers, numpy only)"
    if args.optimum:
        optimum = run_client(
            out, PAIRS, python=optimum_python(folder), client=Path(__file__).with_name("client_optimum.py"), blocked=("headprune",)
        )
        report["optimum"] = compare_predictions(optimum, reference, blocked=("headprune",))
        report["passed"] = report["passed"] and report["optimum"]["passed"]
    print(json.dumps(report, indent=1))
    print(f"[client onnx] {'PASS' if report['passed'] else 'FAIL'}: {out}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
