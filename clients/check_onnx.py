"""The ONNX export in the client people run: plain ONNX Runtime and tokenizers, in a venv that has nothing else.

    python -m clients.check_onnx [--dir .clients/onnx] [--optimum]        (exit 0 when every check passes)

Creates ``<dir>/venv`` (reused on the next run) with only onnxruntime, tokenizers and numpy (the versions of
constraints.txt), prunes the embedded MiniLM (as a 3-way NLI classifier, a seeded uneven mask) and a tiny random Llama
(uneven query heads, an emptied layer), exports each with ``export.format=onnx`` into ``<dir>/<name>`` (and its int8
version), and runs ``headprune/export/onnx_client.py`` in that venv on raw text: token ids, logits and labels (or
greedy tokens) against the masked model's in PyTorch. The int8 directories are opened too (their answers are
counted against f32, not required equal). ``--optimum`` also opens
the directory with optimum's ``ORTModelForSequenceClassification`` (clients/client_optimum.py) in ``<dir>/optimum-venv``:
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

from clients.env import ROOT, pinned

PACKAGES = ("onnxruntime", "tokenizers", "numpy")
OPTIMUM = "optimum-onnx[onnxruntime]==0.1.0"
PROMPTS = ["the cat sat on the", "a dog near home", "the bird"]
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


def masked_and_pruned(model, mask: dict):
    """(head gates on ``model``, a physically pruned copy) for a query-head mask {group: [L, H]}."""
    from headprune.core.attention.gates import HeadGates
    from headprune.core.pruning import prune_mask

    pruned = copy.deepcopy(model)
    prune_mask(pruned, {g: m.clone() for g, m in mask.items()})
    HeadGates(pruned).remove()
    return HeadGates(model), pruned


def pruned_minilm(seed: int = 0) -> dict:
    """The embedded MiniLM as a 3-way NLI classifier with about half its heads masked (seeded, uneven per layer)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from headprune.core.attention.gates import HeadGates
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
        values.view(-1)[torch.randperm(layers * heads, generator=generator)[: layers * heads // 2]] = 0.0
    gates.remove()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return {
        "name": "minilm-pruned",
        "model": model,
        "mask": mask,
        "tokenizer": tokenizer,
        "texts": PAIRS,
        "example": dict(tokenizer(*zip(*PAIRS[:2]), padding=True, return_tensors="pt")),
    }


def pruned_tiny_llama(seed: int = 0) -> dict:
    """A random tiny Llama (3 layers, 4 query heads over 2 KV heads) with uneven query heads and an emptied layer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from headprune.core.attention.gates import HeadGates
    from headprune.models.tokenizers import train_tokenizer

    texts = [f"the {w} sat on the {v} mat near {u}" for w in ("cat", "dog", "bird") for v in ("red", "blue") for u in ("home", "town")]
    tokenizer = train_tokenizer(texts * 5, vocab_size=300)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=64,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config).eval()
    gates = HeadGates(model)
    mask = gates.ones()
    mask["dec_self"][0, 1] = 0.0  # layer 0: 3 query heads over 2 KV heads (uneven)
    mask["dec_self"][1] = 0.0  # layer 1: emptied
    gates.remove()
    batch = tokenizer(texts[:2], padding=True, return_tensors="pt")
    return {
        "name": "tiny-llama-pruned",
        "model": model,
        "mask": mask,
        "tokenizer": tokenizer,
        "texts": PROMPTS,
        "example": {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]},
    }


def check_case(case: dict, folder: Path, python: str, optimum: str | None) -> dict:
    """Export the pruned model into ``folder`` (and its int8 version) and check the directory in each client."""
    from headprune.export import export_model
    from headprune.export.onnx import quantize_int8
    from headprune.export.onnx_dir_check import compare_predictions, masked_predictions, run_client

    gates, pruned = masked_and_pruned(case["model"], case["mask"])
    out = folder / case["name"]
    graphs = export_model("onnx", pruned, case["tokenizer"], out, case["example"])["graphs"]
    quantize_int8(graphs, out / "int8")
    description = json.loads((out / "headprune_export.json").read_text())
    with gates.masked(case["mask"]):
        reference = masked_predictions(case["model"], case["tokenizer"], case["texts"], description)
    answer = run_client(out, case["texts"], python=python)
    report = {"dir": str(out), "heads_per_layer": description["heads_per_layer"], "texts": len(case["texts"])}
    report["onnxruntime"] = compare_predictions(answer, reference)
    int8 = run_client(out / "int8", case["texts"], python=python)
    key = "labels" if "labels" in answer else "new_ids"
    report["int8_answers_equal_f32"] = sum(a == b for a, b in zip(int8[key], answer[key]))
    if optimum:
        client = Path(__file__).with_name("client_optimum.py")
        answer = run_client(out, case["texts"], python=optimum, client=client, blocked=("headprune",))
        report["optimum"] = compare_predictions(answer, reference, blocked=("headprune",))
    report["passed"] = report["onnxruntime"]["passed"] and report.get("optimum", {}).get("passed", True)
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=str(ROOT / ".clients" / "onnx"), help="where the venvs and the exports go")
    parser.add_argument("--optimum", action="store_true", help=f"also open the directories with {OPTIMUM} in a venv of its own")
    args = parser.parse_args()
    folder = Path(args.dir).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    python = client_python(folder)
    optimum = optimum_python(folder) if args.optimum else None
    reports = [check_case(make(), folder, python, optimum) for make in (pruned_minilm, pruned_tiny_llama)]
    print(json.dumps(reports, indent=1))
    for report in reports:
        clients = ", ".join(
            f"{name}: {'PASS' if report[name]['passed'] else 'FAIL'} (max |logits - masked| {report[name]['max_abs_diff']:.1e})"
            for name in ("onnxruntime", "optimum")
            if name in report
        )
        print(f"[client onnx] {report['dir']}: {clients}")
    return 0 if all(r["passed"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
