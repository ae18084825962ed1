"""llama.cpp runs headprune's ``gguf`` files: each greedy token's log-probability, teacher-forced, and llama.cpp's argmax, as (check, passed, detail) rows (client_jobs.py runs it)."""

from functools import partial
from pathlib import Path

import numpy as np

THREADS = 2


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """log p over the vocabulary of each row (float64)."""
    rows = rows.astype(np.float64)
    top = rows.max(axis=1, keepdims=True)
    return rows - top - np.log(np.exp(rows - top).sum(axis=1, keepdims=True))


def gguf_file(directory: str) -> Path:
    """The one GGUF file of an export directory."""
    found = sorted(Path(directory).glob("*.gguf"))
    if len(found) != 1:
        raise FileNotFoundError(f"{directory} holds {len(found)} .gguf files, not one")
    return found[0]


def load(path: Path, n_ctx: int, dtype: str):
    """A llama.cpp context on ``path`` with every position's logits; the KV cache in the file's precision, no flash attention."""
    import llama_cpp
    from llama_cpp import Llama

    cache = llama_cpp.GGML_TYPE_F32 if dtype == "f32" else llama_cpp.GGML_TYPE_F16  # f32: no rounding anywhere
    return Llama(
        model_path=str(path),
        n_ctx=n_ctx,
        n_batch=n_ctx,
        n_ubatch=n_ctx,
        n_threads=THREADS,
        n_threads_batch=THREADS,
        logits_all=True,
        flash_attn=False,
        type_k=cache,
        type_v=cache,
        verbose=False,
    )


def run_job(job: dict) -> list[tuple]:
    """One file through llama.cpp: every prompt and its greedy tokens in one pass, their log-probabilities and argmax against ours."""
    with np.load(job["arrays"]) as npz:
        arrays = {k: npz[k] for k in npz.files}
    sequences = [(arrays[f"prompt{i}"].tolist(), arrays[f"greedy{i}"].tolist()) for i in range(job["prompts"])]
    llm = load(gguf_file(job["path"]), max(len(p) + len(g) for p, g in sequences) + 8, job["dtype"])
    tolerance = job["tolerance"]
    worst, equal, total, near_ties = 0.0, 0, 0, 0
    for i, (prompt, new) in enumerate(sequences):
        if not new:
            continue
        llm.reset()
        llm.eval(prompt + new)
        logp = log_softmax(np.asarray(llm.scores[len(prompt) - 1 : len(prompt) + len(new) - 1]))  # row t predicts token t + 1
        worst = max(worst, float(np.abs(logp[np.arange(len(new)), new] - arrays[f"logprobs{i}"]).max()))
        # our greedy token leads by ``margin``; each side may move by the tolerance, so a lead under twice it may flip
        decided = arrays[f"margin{i}"] >= 2 * tolerance
        equal += int((logp.argmax(1) == np.array(new))[decided].sum())
        total += int(decided.sum())
        near_ties += int((~decided).sum())
    architecture = llm.metadata.get("general.architecture")
    rows = tokenizer_rows(job, partial(llamacpp_ids, llm))
    del llm
    greedy = f"argmax {equal}/{total} equal over {len(sequences)} prompts ({near_ties} near-ties under {2 * tolerance:.0e} skipped)"
    return [
        *rows,
        ("architecture", None, str(architecture)),
        ("greedy tokens", equal == total, greedy),
        ("logprobs", worst <= tolerance, f"max |diff| {worst:.2e} (tolerance {tolerance:.0e}, {job['dtype']} file)"),
    ]


def llamacpp_ids(llm, text: str) -> list[int]:
    """llama.cpp's ids of ``text``, as a prompt is split: no BOS, special-token text read as text."""
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)


def tokenizer_rows(job: dict, tokenize) -> list[tuple]:
    """A row comparing llama.cpp's ids (``tokenize(text)``) of each text with the tokenizer's (``job["text_ids"]``). Where the
    tokenizer adds a space before the text (``job["spaced_ids"]``: its ids of " " + text), a text that differs only there is
    said, not judged: llama.cpp agrees once the text starts with a space; any other difference fails."""
    texts = job.get("texts") or []
    if not texts:
        return []
    differ = [i for i, text in enumerate(texts) if tokenize(text) != job["text_ids"][i]]
    spaced = job.get("spaced_ids")
    other = [i for i in differ if spaced is None or tokenize(" " + texts[i]) != spaced[i]]
    detail = f"{len(texts) - len(differ)}/{len(texts)} texts tokenized alike"
    if other:
        i = other[0]
        detail += f"; {texts[i][:40]!r}: llama.cpp {tokenize(texts[i])[:8]}, the tokenizer {job['text_ids'][i][:8]}"
        return [("tokenizer", False, detail)]
    if differ:
        detail += (
            f"; the other {len(differ)} alike once a space leads the text (the tokenizer adds one, add_prefix_space; "
            "llama.cpp's BPE does not: start prompts with a space)"
        )
        return [("tokenizer", None, detail)]
    return [("tokenizer", True, detail)]


def client_name() -> str:
    """The client and its version, as its rows name it."""
    import importlib.metadata

    return f"llama.cpp (llama-cpp-python {importlib.metadata.version('llama_cpp_python')})"
