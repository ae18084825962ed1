"""export.client_check: the export run by the client people serve it with, where that client is installed."""

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

LOGPROB_TOLERANCE = 1e-4  # float32 on both sides
# llama.cpp's log-probabilities of the greedy tokens against the masked model's (an f16 file: the model with its weights
# rounded as stored), largest |diff| measured on the tiny Llama (llama and deci files) and on SmolLM2-135M (uniform llama,
# uneven deci, deci with emptied FFNs; 72 tokens): f32 file and KV cache 1e-7 tiny, 1.2e-5 to 7.1e-5 SmolLM2; f16 file and
# KV cache 9e-5 tiny, 8.9e-3 to 5.4e-2 SmolLM2 (llama.cpp rounds activations to f16; an f32 KV cache: 3.3e-3 to 3.0e-2)
GGUF_TOLERANCES = {"f32": 1e-3, "f16": 1e-1}
JOBS = Path(__file__).with_name("client_jobs.py")  # what a client venv runs, given the client's script


@dataclass(frozen=True)
class Client:
    """An export format's client: name, venv under the clients directory, script it runs, log-probability tolerance by dtype."""

    name: str
    venv: str
    script: Path
    min_head_dim: int = 1  # smaller heads are refused by the client's kernels, whatever the file
    tolerances: dict = field(default_factory=lambda: {"f32": LOGPROB_TOLERANCE})


CLIENTS = {
    "deci_hf": Client("vLLM CPU", "vllm-venv", Path(__file__).with_name("vllm_client.py"), min_head_dim=32),
    "gguf": Client("llama.cpp", "venv", Path(__file__).with_name("llamacpp_client.py"), tolerances=GGUF_TOLERANCES),
}


def head_dim(model) -> int:
    """The model's attention head size."""
    config = model.config
    return int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)


def clients_dir() -> Path:
    """Where ``make test-clients`` builds the clients: ``$HEADPRUNE_CLIENTS``, else ``.clients/`` beside the source tree."""
    return Path(os.environ.get("HEADPRUNE_CLIENTS") or Path(__file__).resolve().parents[2] / ".clients")


def installed_python(client: Client) -> Path | None:
    """The python of the client's venv when it is built (its ``.ready-*`` stamp), else None."""
    venv = clients_dir() / client.venv
    return venv / "bin" / "python" if any(venv.glob(".ready-*")) else None


@torch.no_grad()
def greedy_arrays(model, prompt: torch.Tensor, tokens: np.ndarray, eos: list[int], kept: list[int] | None = None) -> dict[str, np.ndarray]:
    """prompt{i}, greedy{i} (cut after the first EOS), logprobs{i} of each greedy token under ``model`` and margin{i}, its lead
    over the likeliest other token (log-probabilities): what the client compares. ``kept``: the original ids the file's ids
    0, 1, ... stand for (a renumbered vocabulary): the arrays in the file's ids, log-probabilities over the kept ids only."""
    columns = None if kept is None else torch.tensor(kept, dtype=torch.long)
    to_file = (lambda ids: ids) if kept is None else {old: new for new, old in enumerate(kept)}.__getitem__
    arrays = {}
    for i, (row, new) in enumerate(zip(prompt.tolist(), tokens.tolist())):
        stop = next((k + 1 for k, t in enumerate(new) if t in eos), len(new))
        new = new[:stop]
        ids = torch.tensor([row + new], device=next(model.parameters()).device)
        logits = model(input_ids=ids).logits[0].double()
        logits = logits if columns is None else logits[:, columns.to(logits.device)]  # (T, kept): the file's vocabulary
        logprobs = torch.log_softmax(logits, -1)
        row, new = [to_file(t) for t in row], [to_file(t) for t in new]
        positions, chosen = torch.arange(len(row) - 1, len(row) + len(new) - 1), torch.tensor(new, dtype=torch.long)
        picked = logprobs[positions, chosen]
        others = logprobs[positions].index_put((torch.arange(len(new)), chosen), torch.tensor(-torch.inf, dtype=torch.float64))
        arrays[f"prompt{i}"] = np.array(row, dtype=np.int64)
        arrays[f"greedy{i}"] = np.array(new, dtype=np.int64)
        arrays[f"logprobs{i}"] = picked.cpu().numpy()
        arrays[f"margin{i}"] = (picked - others.max(-1).values).cpu().numpy()
    return arrays


def run_client(fmt: str, python: Path, path: Path, arrays: dict[str, np.ndarray], work: Path, dtype: str, texts: dict | None) -> dict:
    """Run the format's client (``python``: its venv's) on ``path`` (a ``dtype`` file): {"client", "rows", "passed"};
    ``texts`` ({"texts", "text_ids"}: the tokenizer's ids of each) are tokenized by the client too."""
    client = CLIENTS[fmt]
    np.savez(work / "client_arrays.npz", **arrays)
    prompts = sum(1 for key in arrays if key.startswith("prompt"))
    job = {"name": fmt, "path": str(path), "arrays": str(work / "client_arrays.npz"), "prompts": prompts, "dtype": dtype}
    job.update(tolerance=client.tolerances[dtype], **(texts or {}))
    (work / "client_job.json").write_text(json.dumps([job]), encoding="utf-8")
    done = subprocess.run(
        [str(python), "-I", str(JOBS), str(client.script), str(work / "client_job.json")],
        cwd=work,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        rows = [{"check": "client ran", "passed": False, "detail": f"exit {done.returncode}: {done.stderr[-500:]}"}]
    else:
        rows = json.loads(done.stdout.strip().splitlines()[-1])
    return {"client": client.name, "rows": rows, "passed": all(row["passed"] is not False for row in rows)}


def probe_texts(tokenizer, prompt: torch.Tensor) -> dict | None:
    """{"texts", "text_ids"}: llama.cpp's check text and the decoded prompts, with the tokenizer's ids (no special tokens);
    "spaced_ids", its ids of each text after a space, where the tokenizer puts a space before the text (llama.cpp never does)."""
    from headprune.export.llama_cpp_pre import CHKTXT

    if tokenizer is None:
        return None
    texts = [CHKTXT, *(tokenizer.decode(row, skip_special_tokens=True) for row in prompt.tolist())]
    ids = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    probe = {"texts": texts, "text_ids": [ids(text) for text in texts]}
    if adds_prefix_space(tokenizer):
        probe["spaced_ids"] = [ids(" " + text) for text in texts]
    return probe


def adds_prefix_space(tokenizer) -> bool:
    """Whether the tokenizer's byte-level pre-tokenizer puts a space before the text (no llama.cpp BPE pre-tokenizer does)."""
    from headprune.export.tokenizer_files import prefix_space

    backend = getattr(tokenizer, "backend_tokenizer", None)
    return backend is not None and bool(prefix_space(json.loads(backend.to_str()).get("pre_tokenizer")))


def client_line(report: dict) -> str:
    """One printed line: what the client said, or why it did not run."""
    if "skipped" in report:
        return f"[export] export.client_check: {report['skipped']}; checked by headprune's own reader only"
    verdict = "passed" if report["passed"] else "FAILED"
    return f"[export] {report['client']} {verdict}: " + "; ".join(f"{row['check']} {row['detail']}" for row in report["rows"])


def checked_in_client(task, mask, reference, fmt: str, dtype: str, out: Path, staging: Path, ids=None) -> dict:
    """export.client_check: the ``dtype`` file run by its client where one is installed (a ValueError when it disagrees), printed;
    ``ids`` (a Renumbering): the file's token ids and the tokenizer it ships, where a kind renumbered them."""
    client = CLIENTS.get(fmt)
    python = client and installed_python(client)
    if client is None or reference.greedy is None:
        clients = ", ".join(f"{f}: {c.name}" for f, c in CLIENTS.items())
        report = {"skipped": f"no client runs export.format={fmt} here (clients: {clients})"}
    elif python is None:
        report = {"skipped": f"{client.name} is not installed in {clients_dir() / client.venv} (make test-clients builds it)"}
    elif (size := head_dim(reference.model)) < client.min_head_dim:
        report = {"skipped": f"{client.name} runs head sizes of {client.min_head_dim} and more, this model's is {size}"}
    else:
        prompt, tokens, eos = reference.greedy[:3]
        kept = None if ids is None else ids.kept
        with task.gates.masked(mask):
            arrays = greedy_arrays(reference.model, prompt, tokens, eos, kept)
        # the tokenizer shipped, on the prompts in the file's ids
        tokenizer, shown = (task.tokenizer, prompt) if kept is None else (ids.tokenizer, ids.old_to_new()[prompt])
        texts = probe_texts(tokenizer, shown) if fmt == "gguf" else None
        with tempfile.TemporaryDirectory() as work:
            report = run_client(fmt, python, out, arrays, Path(work), dtype, texts)
    print(client_line(report), flush=True)
    if report.get("passed") is False:
        (staging / "check.json").write_text(json.dumps({"client_check": report}, indent=1, default=str))
        raise ValueError(f"{client_line(report)}: the export stays in {staging}, the previous one is kept")
    return report
