"""The real pipeline for ``make test-clients``: SmolLM2 pruned with recovery, exported as GGUF on every path.

``headprune experiment=prune`` (the embedded SmolLM2, one KV group of three per layer, least-squares recovery; or a
given prune run), then ``experiment=export export.format=gguf`` three ways: the recovered point (``export.point``), its
saved directory (``export.model``) and the point's mask on the base model (``export.mask_order`` / ``mask_step``).
Each file becomes a job for clients/clients_check.py: llama.cpp's token ids of real English lines (Multi30k) against the
model's tokenizer's, and llama.cpp's corpus perplexity of those lines against PyTorch's (the model headprune exported).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

PRUNE = [
    "experiment=prune",
    "model=smollm2",
    "data=lm_local",
    "prune.unit=kv_group",
    "prune.fractions=[0.333334]",
    "prune.min_units_per_layer=1",
    "prune.recover=lsq",
]
SMALL = ["data.limits.eval=64", "data.limits.eval_other=16", "data.limits.importance=128", "data.limits.heldout=32"]  # a quicker run
EXPORT = ["experiment=export", "model=smollm2", "data=lm_local", "prune.unit=kv_group", "export.format=gguf", "export.examples=16"]
LINES = 40  # Multi30k English test lines, plus every line holding a quoted phrase (` "`: llama.cpp's pre-tokenizers differ there)


def headprune(run_dir: Path, overrides: list[str]) -> dict:
    """Run the headprune command into ``run_dir`` (same settings again: it resumes or is redone); its results.json."""
    command = [str(Path(sys.executable).with_name("headprune")), *overrides, f"hydra.run.dir={run_dir}", "logger=none"]
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True, env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    return json.loads((run_dir / "results.json").read_text(encoding="utf-8"))


def recovered_point(run: dict) -> tuple[str, dict]:
    """The name (``importance+lsq@33%``) and record of the run's recovered point that kept its model."""
    from headprune.results.points import point_name
    from headprune.sources.point_models import point_id

    results = run["results"]
    for point in results.get("points") or (results.get("pareto") or {}).get("points") or []:
        if point.get("model_dir") and point.get("recovery") == "lsq":
            return point_id(point_name(point), str(point["step"])), point
    raise SystemExit("the prune run has no recovered point with a saved model (prune.recover=lsq, prune.save=recovered)")


def english_lines(data_dir: Path) -> list[str]:
    """The first ``LINES`` lines of Multi30k's English test set and every other line with `` "`` in it."""
    lines = (data_dir / "multi30k" / "test.en").read_text(encoding="utf-8").splitlines()
    return lines[:LINES] + [line for line in lines[LINES:] if ' "' in line]


@torch.no_grad()
def torch_perplexity(model, ids: list[list[int]]) -> float:
    """Corpus perplexity exp(sum NLL / tokens predicted) of each id list scored from its first token (float64 sums)."""
    nll, count = 0.0, 0
    for row in ids:
        logits = model(input_ids=torch.tensor([row])).logits[0, :-1].double()
        nll -= float(torch.log_softmax(logits, -1).gather(1, torch.tensor(row[1:])[:, None]).sum())
        count += len(row) - 1
    return float(np.exp(nll / count))


def exported_model(result: dict):
    """The model headprune exported, in PyTorch: the saved point, or the base SmolLM2 pruned by the export's record."""
    from transformers import AutoModelForCausalLM

    from headprune.core.pruning import prune_heads
    from headprune.core.saving import load_pruned
    from headprune.models.embedded import embedded_model_dir

    source = result["inputs"].get("model")  # a point's or export.model's directory; the mask path names the model
    if source and Path(source).is_dir():
        return load_pruned(source).eval()
    model = AutoModelForCausalLM.from_pretrained(embedded_model_dir("smollm2"), dtype=torch.float32).eval()
    record = result["results"]["pruning_record"]
    prune_heads(model, {g: {int(layer): heads for layer, heads in layers.items()} for g, layers in record.items()})
    return model


def pipeline_jobs(out: Path, data_dir: Path, prune_run: Path | None = None) -> list[dict]:
    """Prune (or reuse ``prune_run``), export the recovered point three ways, and one clients job per GGUF file."""
    from transformers import AutoTokenizer

    from headprune.models.embedded import embedded_model_dir

    run_dir = prune_run or out / "prune"
    run = json.loads((run_dir / "results.json").read_text()) if prune_run else headprune(run_dir, PRUNE + SMALL)
    point, record = recovered_point(run)
    mask_file = f"export.mask_file={run_dir / 'results.json'}"
    paths = {
        "point": [mask_file, f"export.point={point}"],
        "saved dir": [f"export.model={run_dir / record['model_dir']}"],
        "mask": [mask_file, f"export.mask_order={point.split('@')[0]}", f"export.mask_step={record['step']}"],
    }
    texts = english_lines(data_dir)
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir("smollm2"))
    start = tokenizer.convert_tokens_to_ids("<|endoftext|>")  # model.text_start of conf/model/smollm2.yaml
    text_ids = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]
    scored = [[start, *ids] for ids in text_ids]
    jobs = []
    for path, overrides in paths.items():
        folder = out / f"export-{path.replace(' ', '-')}"
        result = headprune(folder, EXPORT + overrides + ["overwrite=true"])
        arrays = folder / "ids.npz"
        np.savez(arrays, **{f"ids{i}": np.array(ids, dtype=np.int64) for i, ids in enumerate(scored)})
        jobs.append(
            {
                "name": f"smollm2 {point} by {path}",
                "format": "pipeline",
                "path": str(folder / result["results"]["files"][0]),
                "arrays": str(arrays),
                "texts": texts,
                "text_ids": text_ids,
                "tokenizer_pre": result["results"]["tokenizer_pre"]["name"],
                "expected_pre": "smollm",  # the embedded GGUF's: what llama.cpp needs for SmolLM's tokenizer
                "perplexity": torch_perplexity(exported_model(result), scored),
                "tolerance": 1e-3,  # relative
                "check": {k: result["results"]["check"][k] for k in ("max_abs_diff", "tolerance", "f32_roundoff")},
            }
        )
    return jobs
