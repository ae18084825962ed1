"""NVIDIA's kvpress runs a model with a head pattern headprune wrote: passkey prompts through its pipeline, answers to JSON.

Runs in ``.clients/kvpress-venv`` (kvpress pins an older transformers; clients/env.ensure_kvpress_env), never
imports headprune. For each pattern directory (``full_attention_heads.tsv`` + ``config.json``, headprune.export.kvpress)
it builds ``DuoAttentionPress(head_compression_ratio=<config's>)`` and answers every prompt with the
``kv-press-text-generation`` pipeline (context prefilled under the press, then question and greedy answer).
kvpress 0.5.5 fetches patterns only from mit-han-lab/duo-attention on GitHub (by ``model.config.name_or_path``):
here its own loader reads the local files instead (its ``requests.get`` answered from the directory), so the TSV and
config are parsed by kvpress's code.

    python clients/client_kvpress.py JOB.json OUT.json

JOB: {"model_dir", "chat_template" (false: the pipeline prompts without it), "max_new_tokens", "prompts": [{"context", "question", "answer_prefix", "answer", "context_ids",
"question_ids"}], "patterns": [{"name", "dir"}]}. OUT: {"versions", "patterns": {name: {"answers", "correct",
"accuracy", "ids_equal", "streaming_mask", "mask_equal", "hidden", "compression_ratio"}}}: ``hidden``, per prompt and
layer, the context keys the press hid ({KV head: [first, last + 1, count]}).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch


class LocalPatterns:
    """Stands in for ``requests`` in kvpress's DuoAttention loader: its GitHub URLs answered from one local directory."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def get(self, url: str, *args, **kwargs):
        text = (self.folder / url.rsplit("/", 1)[-1]).read_text(encoding="utf-8")  # config.json, full_attention_heads.tsv
        return SimpleNamespace(text=text, json=lambda: json.loads(text))


def duo_press(model, folder: Path):
    """kvpress's DuoAttentionPress for the pattern in ``folder``, loaded by kvpress's own loader; (press, config)."""
    from kvpress import DuoAttentionPress
    from kvpress.presses import duo_attention_press as duo

    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    duo.PATTERNS_DICT[model.config.name_or_path] = "local"
    duo.requests = LocalPatterns(folder)
    duo.cache.clear()  # kvpress caches one pattern per model name
    return DuoAttentionPress(head_compression_ratio=float(config["head_compression_ratio"])), config


def first_number(text: str) -> str | None:
    """The first run of digits in an answer (the retrieved key), or None."""
    found = re.search(r"\d+", text)
    return found.group(0) if found else None


def hidden_keys(model) -> list[dict[str, list[int]]]:
    """Per layer, the context keys kvpress's press hid for the answer: {KV head: [first, last + 1, count]} of the
    positions in ``masked_key_indices`` (set after prefill, read by its attention patch while decoding)."""
    layers = []
    for layer in model.model.layers:
        found = getattr(layer.self_attn, "masked_key_indices", None)
        rows: dict[int, list[int]] = {}
        if found is not None:
            for head, position in zip(found[1].tolist(), found[2].tolist()):
                rows.setdefault(head, []).append(position)
        layers.append({str(h): [min(v), max(v) + 1, len(v)] for h, v in sorted(rows.items())})
    return layers


def run_pattern(pipe, model, pattern: dict, prompts: list[dict], max_new_tokens: int) -> dict:
    """Every prompt answered through the pipeline under one pattern's press."""
    folder = Path(pattern["dir"])
    press, config = duo_press(model, folder)
    answers, ids_equal, ratios, hidden = [], True, [], []
    for prompt in prompts:
        tensors = pipe.preprocess(prompt["context"], [prompt["question"]], prompt["answer_prefix"], 10**9)
        ids_equal &= tensors["context_ids"][0].tolist() == prompt["context_ids"]
        ids_equal &= tensors["questions_ids"][0][0].tolist() == prompt["question_ids"]
        out = pipe(prompt["context"], question=prompt["question"], answer_prefix=prompt["answer_prefix"], press=press,
                   max_new_tokens=max_new_tokens)  # fmt: skip
        answers.append(out["answer"])
        ratios.append(press.compression_ratio_)
        hidden.append(hidden_keys(model))
    written = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t", ndmin=2) < config["threshold"]
    mask = press.streaming_mask.cpu().numpy()
    correct = [first_number(a) == p["answer"] for a, p in zip(answers, prompts)]
    return {
        "answers": answers,
        "correct": correct,
        "accuracy": sum(correct) / len(correct),
        "ids_equal": bool(ids_equal),
        "streaming_mask": mask.astype(int).tolist(),
        "mask_equal": bool(mask.shape == written.shape and (mask == written).all()),
        "hidden": hidden,
        "compression_ratio": float(np.mean(ratios)),  # kvpress's: streamed share x the share of context hidden
        "sink_size": press.sink_size,
        "recent_size": press.recent_size,
    }


def main(job_path: str, out_path: str) -> int:
    import importlib.metadata

    import kvpress  # noqa: F401  (patches the attention functions for head-wise masking)
    from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

    torch.set_num_threads(1)
    job = json.loads(Path(job_path).read_text(encoding="utf-8"))
    model = AutoModelForCausalLM.from_pretrained(job["model_dir"], dtype=torch.float32, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(job["model_dir"])
    if not job["chat_template"]:
        tokenizer.chat_template = None  # the pipeline then prompts BOS + context, question + newline + answer prefix
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")
    results = {p["name"]: run_pattern(pipe, model, p, job["prompts"], job["max_new_tokens"]) for p in job["patterns"]}
    versions = {name: importlib.metadata.version(name) for name in ("kvpress", "transformers", "torch")}
    Path(out_path).write_text(json.dumps({"versions": versions, "patterns": results}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(*sys.argv[1:3]))
