"""The clients' side of ``make test-clients``: run in the clients venv (stock transformers, llama-cpp-python; no headprune).

    python -I clients/clients_check.py <work dir>/jobs.json     (prints one JSON line: a list of rows)

Each job names an export (an HF directory or a GGUF file) and ``arrays.npz``: the prompts' token ids, the masked
model's logits on every prompt and its greedy continuation. A row per check: logits within the job's tolerance
(relative to the logits' scale, at least 1), the same greedy tokens, the same token ids for the texts. A ``pipeline`` job
is a GGUF file of headprune's export command: its pre-tokenizer, llama.cpp's token ids of real lines and its perplexity.
"""

from __future__ import annotations

import importlib.util
import json
import sys

import numpy as np


def _row(job: dict, client: str, check: str, passed: bool, detail: str) -> dict:
    return {"client": client, "file": job["name"], "check": check, "passed": None if passed is None else bool(passed), "detail": detail}


def _logit_rows(job: dict, client: str, logits: list, arrays, label: str = "logits") -> list[dict]:
    references = [arrays[f"reference{i}"] for i in range(job["prompts"])]
    diff = max(float(np.abs(got - ref).max()) for got, ref in zip(logits, references))
    scale = max(float(np.abs(ref).max()) for ref in references)
    table = job.get("table_logits", 0.0)  # what llama.cpp's float16 GELU table moves the logits by (clients/ggml_gelu.py)
    tolerance = job["tolerance"] * max(1.0, scale) + table
    added = f" = {job['tolerance']:.0e} of the scale + GELU table {table:.1e}" if table else ""
    return [_row(job, client, label, diff <= tolerance, f"max |diff| {diff:.2e} at scale {scale:.1f} (tolerance {tolerance:.1e}{added})")]


def _log_softmax(rows: np.ndarray) -> np.ndarray:
    """log p over the vocabulary of each row (float64)."""
    rows = rows.astype(np.float64)
    top = rows.max(axis=-1, keepdims=True)
    return rows - top - np.log(np.exp(rows - top).sum(axis=-1, keepdims=True))


def _logprob_row(job: dict, client: str, logits: list, arrays, tolerance: float, label: str, table: float = 0.0) -> dict:
    """Teacher-forced log p of each prompt's next tokens against the masked model's, absolute (nats); ``table``: what
    llama.cpp's float16 GELU table moves them by, added to the tolerance."""
    diff = 0.0
    for i, got in enumerate(logits):
        prompt, reference = arrays[f"prompt{i}"], arrays[f"reference{i}"]
        steps = np.arange(len(prompt) - 1)  # row t predicts token t + 1
        picked = [_log_softmax(rows[: len(prompt) - 1])[steps, prompt[1:]] for rows in (got, reference)]
        diff = max(diff, float(np.abs(picked[0] - picked[1]).max()))
    added = f" + GELU table {table:.1e}" if table else ""
    return _row(job, client, label, diff <= tolerance + table, f"max |diff| {diff:.2e} nats (tolerance {tolerance:.0e}{added})")


def _greedy_row(job: dict, client: str, tokens: list[list[int]], arrays, label: str = "greedy tokens") -> dict:
    expected = [arrays[f"greedy{i}"].tolist() for i in range(job["prompts"])]
    equal = [sum(a == b for a, b in zip(got, want)) for got, want in zip(tokens, expected)]
    total = sum(len(want) for want in expected)
    return _row(job, client, label, sum(equal) == total, f"{sum(equal)}/{total} equal over {len(expected)} prompts")


def check_hf(job: dict, arrays) -> list[dict]:
    """Stock transformers: AutoModelForCausalLM and AutoTokenizer from the exported directory."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    client = f"transformers {__import__('transformers').__version__}"
    model = AutoModelForCausalLM.from_pretrained(job["path"], dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(job["path"])
    logits, tokens = [], []
    with torch.no_grad():
        for i in range(job["prompts"]):
            ids = torch.from_numpy(arrays[f"prompt{i}"])[None]
            logits.append(model(input_ids=ids).logits[0].float().numpy())
            n = len(arrays[f"greedy{i}"])
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n, min_new_tokens=n)
            tokens.append(out[0, ids.shape[1] :].tolist())
    encoded = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in job["texts"]]
    return [
        *_logit_rows(job, client, logits, arrays),
        _greedy_row(job, client, tokens, arrays),
        _row(job, client, "tokenizer", encoded == job["text_ids"], f"{len(job['texts'])} texts"),
        _row(job, client, "architecture", type(model).__name__ == job["expect"], type(model).__name__),
    ]


def _llama_cpp_run(job: dict, arrays, flash: bool, cache_type: str) -> tuple[list, list, list, str]:
    """Logits of every prompt, the greedy continuation through llama.cpp's KV cache, the texts' token ids, the architecture."""
    import llama_cpp
    from llama_cpp import Llama

    length = max(len(arrays[f"prompt{i}"]) + len(arrays[f"greedy{i}"]) for i in range(job["prompts"]))
    cache = llama_cpp.GGML_TYPE_F32 if cache_type == "f32" else llama_cpp.GGML_TYPE_F16  # llama.cpp's default: f16
    llm = Llama(
        job["path"],
        n_ctx=length + 8,
        n_batch=length + 8,
        n_threads=2,
        logits_all=True,
        flash_attn=flash,
        type_k=cache,
        type_v=cache,
        verbose=False,
    )
    logits, tokens = [], []
    for i in range(job["prompts"]):
        prompt = arrays[f"prompt{i}"].tolist()
        llm.reset()
        llm.eval(prompt)
        logits.append(np.array(llm.scores[: len(prompt)], dtype=np.float32))
        new = []
        for _ in range(len(arrays[f"greedy{i}"])):
            new.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
            llm.eval([new[-1]])
        tokens.append(new)
    encoded = [llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) for text in job["texts"]]
    architecture = llm.metadata.get("general.architecture")
    del llm
    return logits, tokens, encoded, architecture


def check_gguf(job: dict, arrays) -> list[dict]:
    """llama.cpp through its Python bindings: the file loads, its logits and greedy tokens match (KV cache f32 with flash
    attention off and on, and llama.cpp's default f16 cache)."""
    import llama_cpp

    client = f"llama.cpp (llama-cpp-python {llama_cpp.__version__})"
    rows = []
    # An f32 KV cache without flash attention computes in f32 throughout (an f32 file: the tight tolerance). Flash attention
    # casts K and V to f16 and llama.cpp's default cache is f16: those runs, and f16 files, round, so they get the f16
    # tolerance, and their greedy tokens are reported, not required (rounding can flip a near-tie of a random model).
    for flash, cache_type in ((False, "f32"), (True, "f32"), (False, "f16")):
        logits, tokens, encoded, architecture = _llama_cpp_run(job, arrays, flash, cache_type)
        exact = job["dtype"] == "f32" and cache_type == "f32" and not flash
        suffix = f" ({cache_type} KV cache{', flash attention' if flash else ''})"
        # an f32 run's tolerance adds what llama.cpp's GELU table alone moves the masked model by (the f16 ones hold it)
        table = {"table_logits": job.get("gelu_table_logits", 0.0) if exact else 0.0}
        tolerance = job["tolerance" if exact else "f16_tolerance"]
        rows += _logit_rows({**job, "tolerance": tolerance, **table}, client, logits, arrays, "logits" + suffix)
        if "logprob_tolerance" in job:
            tolerance = job["logprob_tolerance" if exact else "f16_logprob_tolerance"]
            added = job.get("gelu_table_logprobs", 0.0) if exact else 0.0
            rows.append(_logprob_row(job, client, logits, arrays, tolerance, "log-probs" + suffix, added))
        greedy = _greedy_row(job, client, tokens, arrays, "greedy tokens" + suffix)
        rows.append(greedy if exact or greedy["passed"] else {**greedy, "passed": None})
    rows.append(_row(job, client, "architecture", architecture == job["expect"], str(architecture)))
    if job.get("check_tokenizer", True):
        rows.append(_row(job, client, "tokenizer", encoded == job["text_ids"], f"{len(job['texts'])} texts"))
    return rows


def check_lm_eval(job: dict, arrays) -> list[dict]:
    """lm-evaluation-harness on the hf export: a local rolling-loglikelihood task; word perplexity against the masked model's."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    client = f"lm-eval {lm_eval.__version__ if hasattr(lm_eval, '__version__') else ''}".strip()
    args = f"pretrained={job['path']},dtype=float32,prefix_token_id={job['prefix_token_id']}"
    results = lm_eval.simple_evaluate(
        model="hf", model_args=args, tasks=[job["task"]], task_manager=TaskManager(include_path=job["task_dir"]), device="cpu", batch_size=1
    )
    got = float(results["results"][job["task"]]["word_perplexity,none"])
    expected = float(arrays["word_perplexity"])
    gap = abs(got - expected) / expected
    return [_row(job, client, "word perplexity", gap <= job["tolerance"], f"{got:.6f} against {expected:.6f} (relative {gap:.1e})")]


def _sibling(name: str):
    """A module of this folder (the venv runs with -I: this folder is not on the path)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_numbers(job: dict, arrays) -> list[dict]:
    """clients/client_llamacpp.py on a GGUF file: corpus perplexity of the prompts against the masked model's (from its
    logits), and the KV cache llama.cpp allocates against the pruned shape's (f16 cache: 2 bytes for K and for V)."""
    import tempfile
    from pathlib import Path

    numbers = _sibling("client_llamacpp")
    client = "llama.cpp (clients/client_llamacpp.py)"
    prompts = [arrays[f"prompt{i}"] for i in range(job["prompts"])]
    nll = sum(-numbers.log_softmax(arrays[f"reference{i}"][:-1])[np.arange(len(p) - 1), p[1:]].sum() for i, p in enumerate(prompts))
    expected = float(np.exp(nll / sum(len(p) - 1 for p in prompts)))
    with tempfile.TemporaryDirectory() as folder:
        texts = Path(folder) / "texts.npz"
        np.savez(texts, **{f"ids{i}": p for i, p in enumerate(prompts)})
        got = numbers.perplexity(str(texts), job["path"], "f32", False, 2)["perplexity"]
    gap = abs(got - expected) / expected
    rows = [_row(job, client, "corpus perplexity", gap <= job["tolerance"], f"{got:.6f} against {expected:.6f} (relative {gap:.1e})")]
    kv_heads = [kv for _, kv in job["layers"]]
    flash = numbers.kv(job["path"], "f16", True)
    got, want = flash["bytes_per_token"], 2 * 2 * job["head_dim"] * sum(kv_heads)
    close = abs(got - want) <= 1.001 * flash["resolution"]  # llama.cpp logs MiB with two decimals: half a unit off at most
    rows.append(_row(job, client, "KV bytes/token, flash attention", close, f"{got:,.1f} against {want:,} of the pruned shape"))
    plain = numbers.kv(job["path"], "f16", False)["bytes_per_token"]
    rows.append(_row(job, client, "KV bytes/token, no flash attention", None, f"{plain:,.0f} (V padded to the widest layer)"))
    return rows


def check_pipeline(job: dict, arrays) -> list[dict]:
    """A GGUF file headprune's export wrote: its pre-tokenizer, llama.cpp's token ids of real lines against the model's
    tokenizer's, and llama.cpp's corpus perplexity of those lines (f32 KV cache) against PyTorch's."""
    from llama_cpp import Llama

    numbers = _sibling("client_llamacpp")
    client = "llama.cpp (llama-cpp-python)"
    llm = Llama(job["path"], n_ctx=512, n_threads=2, vocab_only=True, verbose=False)
    written = llm.metadata.get("tokenizer.ggml.pre")
    encoded = [llm.tokenize(text.encode("utf-8"), add_bos=False, special=False) for text in job["texts"]]
    del llm
    equal = sum(got == want for got, want in zip(encoded, job["text_ids"]))
    differ = next((text for text, got, want in zip(job["texts"], encoded, job["text_ids"]) if got != want), None)
    got = numbers.perplexity(job["arrays"], job["path"], "f32", False, 2)["perplexity"]
    gap = abs(got - job["perplexity"]) / job["perplexity"]
    check = job["check"]
    return [
        _row(job, client, "pre-tokenizer", written == job["expected_pre"], f"{written} (headprune chose {job['tokenizer_pre']})"),
        _row(
            job,
            client,
            "token ids of real text",
            equal == len(job["texts"]),
            f"{equal}/{len(job['texts'])} lines equal" + (f"; first that differs: {differ!r}" if differ else ""),
        ),
        _row(job, client, "perplexity", gap <= job["tolerance"], f"{got:.6f} against PyTorch {job['perplexity']:.6f} (relative {gap:.1e})"),
        _row(
            job,
            "headprune's check",
            "logits",
            None,
            f"max |diff| {check['max_abs_diff']:.2e}, tolerance {check['tolerance']:.2e} (f32 round-off {check['f32_roundoff']:.2e})",
        ),
    ]


def main(path: str) -> None:
    if importlib.util.find_spec("headprune") is not None:
        raise AssertionError("headprune is importable in the clients' venv: the checks would not be independent")
    rows = []
    for job in json.loads(open(path, encoding="utf-8").read()):
        with np.load(job["arrays"]) as npz:
            arrays = {k: npz[k] for k in npz.files}
        try:
            checks = {"hf": check_hf, "gguf": check_gguf, "lm_eval": check_lm_eval, "numbers": check_numbers, "pipeline": check_pipeline}
            check = checks[job["format"]]
            rows += check(job, arrays)
        except Exception as err:  # one client failing is one failed row, the others still run
            rows.append(_row(job, job["format"], "loads", False, f"{type(err).__name__}: {err}"[:300]))
    print(json.dumps(rows))


if __name__ == "__main__":
    main(sys.argv[1])
