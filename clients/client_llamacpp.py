"""A deployer's measures of GGUF files in llama.cpp, run in the clients venv (llama-cpp-python; no headprune, no torch).

    python -I clients/client_llamacpp.py perplexity <texts.npz> <file.gguf> [--cache f16|f32] [--flash]
    python -I clients/client_llamacpp.py kv <file.gguf> [--cache f16|f32] [--flash]
    python -I clients/client_llamacpp.py speed <name=file.gguf> ... [--repeats N] [--threads T] [--prompt 512] [--gen 128]
    python -I clients/client_llamacpp.py quantize <in.gguf> <out.gguf> [--type q8_0] [--threads T]

Each prints one JSON line. ``perplexity``: corpus perplexity exp(sum NLL / tokens predicted) over the texts' token ids
(``ids<i>`` arrays, BOS first), each text scored from its first token, as headprune's LM task scores it. ``kv``: the KV
cache llama.cpp allocates, read from its own log, in bytes per token of context. ``speed``: llama-bench's pp/tg through
the bindings: a prompt of ``--prompt`` tokens in one batch from an empty cache (prompt tokens/s), then ``--gen`` tokens
one at a time from an empty cache (generation tokens/s); the files take turns, repeat by repeat, in reverse order every
other repeat. ``quantize``: llama.cpp's ``llama_model_quantize`` (what its llama-quantize tool calls) with its default
parameters; the tensor types written and the tensors that fell back to another type (a Q8_0 row needs a multiple of 32
values: an FFN down projection of another width is stored as F16), read from llama.cpp's log.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np


def load(path: str, n_ctx: int, cache: str, flash: bool, threads: int, logits_all: bool = False, verbose: bool = False):
    """A llama.cpp context on ``path``: ``cache`` the KV cache type (llama.cpp's default f16, or f32), flash attention on/off."""
    import llama_cpp
    from llama_cpp import Llama

    kind = llama_cpp.GGML_TYPE_F32 if cache == "f32" else llama_cpp.GGML_TYPE_F16
    return Llama(
        path,
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=logits_all,
        flash_attn=flash,
        type_k=kind,
        type_v=kind,
        verbose=verbose,
    )


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """log p over the vocabulary of each row (float64)."""
    rows = rows.astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    return rows - top - np.log(np.exp(rows - top).sum(axis=1, keepdims=True))


def perplexity(texts: str, path: str, cache: str, flash: bool, threads: int) -> dict:
    """Corpus perplexity of the texts' token ids through llama.cpp, with each text's NLL sum and tokens predicted."""
    with np.load(texts) as npz:
        ids = [npz[f"ids{i}"].tolist() for i in range(len(npz.files))]
    llm = load(path, max(map(len, ids)) + 8, cache, flash, threads, logits_all=True)
    nll, counts = [], []
    start = time.perf_counter()
    for text in ids:
        llm.reset()
        llm.eval(text)
        logp = log_softmax(np.asarray(llm.scores[: len(text) - 1]))  # row t predicts token t + 1
        nll.append(float(-logp[np.arange(len(text) - 1), text[1:]].sum()))
        counts.append(len(text) - 1)
    seconds = time.perf_counter() - start
    return {
        "file": path,
        "cache": cache,
        "flash_attn": flash,
        "texts": len(ids),
        "tokens_predicted": int(sum(counts)),
        "perplexity": float(np.exp(sum(nll) / sum(counts))),
        "nll": nll,
        "seconds": seconds,
    }


KV_LINE = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers")


def kv(path: str, cache: str, flash: bool, n_ctx: int = 4096) -> dict:
    """The KV cache llama.cpp allocates for ``n_ctx`` cells, from its log (a child process: the log goes to its stderr)."""
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import client_llamacpp as c; "
        "c.load(sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5] == '1', 1, verbose=True)"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, here, path, str(n_ctx), cache, "1" if flash else "0"], capture_output=True, text=True
    )
    found = KV_LINE.search(done.stderr)
    if done.returncode or not found:
        raise RuntimeError(f"llama.cpp did not report its KV cache for {path}: {done.stderr[-500:]}")
    mib, cells, layers = float(found.group(1)), int(found.group(2)), int(found.group(3))
    return {
        "file": path,
        "cache": cache,
        "flash_attn": flash,
        "cells": cells,
        "layers_with_cache": layers,
        "bytes_per_token": mib * 2**20 / cells,
        "resolution": 0.005 * 2**20 / cells,  # bytes per token: the log's MiB have two decimals
        "log": found.group(0),
    }


def speed(files: dict, repeats: int, threads: int, prompt: int, gen: int, cache: str, flash: bool) -> dict:
    """Prompt and generation tokens/s of each file, the files taking turns: each file's rate at every repeat and their median."""
    rng = np.random.default_rng(0)
    models = {name: load(path, prompt + gen + 8, cache, flash, threads) for name, path in files.items()}
    vocab = min(llm.n_vocab() for llm in models.values())
    tokens = [int(t) for t in rng.integers(min(100, vocab // 2), vocab, size=prompt)]  # one fixed prompt, as llama-bench's random tokens
    rates = {name: {"pp": [], "tg": []} for name in files}
    for repeat in range(repeats + 1):  # repeat 0 warms each model up and is not kept
        turn = list(models.items())
        for name, llm in turn if repeat % 2 else turn[::-1]:  # ABBA: every other repeat in reverse, so no file always follows another
            llm.reset()
            start = time.perf_counter()
            llm.eval(tokens)
            pp = prompt / (time.perf_counter() - start)
            llm.reset()
            start = time.perf_counter()
            for t in tokens[:gen]:  # one token per step from an empty cache: the cost of decoding, not of sampling
                llm.eval([t])
            tg = gen / (time.perf_counter() - start)
            if repeat:
                rates[name]["pp"].append(pp)
                rates[name]["tg"].append(tg)
    out = {"threads": threads, "prompt": prompt, "gen": gen, "cache": cache, "flash_attn": flash, "repeats": repeats, "files": {}}
    for name in files:
        out["files"][name] = {
            "path": files[name],
            **{kind: {"median": float(np.median(rates[name][kind])), "rates": rates[name][kind]} for kind in ("pp", "tg")},
        }
    return out


QUANT_TYPES = {"q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0", "q4_k_m": "LLAMA_FTYPE_MOSTLY_Q4_K_M", "f16": "LLAMA_FTYPE_MOSTLY_F16"}
FALLBACK_LINE = re.compile(r"(\S+)\s+- ncols\s+(\d+) not divisible by\s+(\d+).*falling back to\s+(\S+)")


def quantize(source: str, target: str, kind: str, threads: int) -> dict:
    """``source`` quantized to ``kind`` into ``target`` by llama.cpp (in a child process: its log goes to the child's stderr)."""
    code = (
        "import ctypes, sys, llama_cpp; p = llama_cpp.llama_model_quantize_default_params(); "
        "p.ftype = getattr(llama_cpp, sys.argv[3]); p.nthread = int(sys.argv[4]); "
        "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, source, target, QUANT_TYPES[kind], str(threads)], capture_output=True, text=True
    )
    if done.returncode or not os.path.isfile(target):
        raise RuntimeError(f"llama.cpp could not quantize {source} to {kind}: {done.stderr[-800:]}")
    fallbacks = [
        {"tensor": m.group(1), "columns": int(m.group(2)), "block": int(m.group(3)), "type": m.group(4)}
        for m in FALLBACK_LINE.finditer(done.stderr)
    ]
    return {
        "file": target,
        "source": source,
        "type": kind,
        "bytes": os.path.getsize(target),
        "source_bytes": os.path.getsize(source),
        "fallbacks": fallbacks,
    }


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("what", choices=["perplexity", "kv", "speed", "quantize"])
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--cache", choices=["f16", "f32"], default="f16")
    parser.add_argument("--flash", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--gen", type=int, default=128)
    parser.add_argument("--type", choices=sorted(QUANT_TYPES), default="q8_0", help="quantize: the file type written")
    args = parser.parse_args(argv)
    if args.what == "perplexity":
        result = perplexity(args.inputs[0], args.inputs[1], args.cache, args.flash, args.threads)
    elif args.what == "quantize":
        result = quantize(args.inputs[0], args.inputs[1], args.type, args.threads)
    elif args.what == "kv":
        result = kv(args.inputs[0], args.cache, args.flash)
    else:
        files = dict(item.split("=", 1) for item in args.inputs)
        result = speed(files, args.repeats, args.threads, args.prompt, args.gen, args.cache, args.flash)
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
