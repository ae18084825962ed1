"""``make test-clients``, kvpress: SmolLM2's streaming patterns written by headprune, run by NVIDIA's kvpress on passkey prompts.

Patterns (headprune.export.kvpress): ``full`` (no KV group streamed), ``third`` (a seeded third of the KV groups) and
``all`` (every KV group). clients/client_kvpress.py answers every prompt through kvpress's pipeline with
DuoAttentionPress in ``.clients/kvpress-venv``; the checks:

- kvpress read the pattern: the heads its press streams are the file's; its token ids are the ones built here;
- its press hid exactly the streamed positions: for every prompt and layer, the context keys it masks are each streamed
  KV head's positions sink .. context - window, and none of the others;
- ``full``: kvpress's answers are the unpruned model's (greedy, same ids);
- each streamed pattern: kvpress's answers are those of an explicit mask in kvpress's semantics (full prefill, then
  the sink and the context's last ``window`` tokens; clients/stream_reference.py): the file means what it says;
- ``full``: kvpress's passkey accuracy is headprune's; for a streamed pattern the two accuracies are shown side by side
  (information, not a check): headprune streams in prefill too, kvpress does not (see headprune.export.kvpress), and
  on SmolLM2 random thirds of the KV groups gave gaps from -0.4 to +0.4 on 5 prompts.

headprune's side is the product itself (``stream_reference.gated_answers``: StreamGates at alpha 0 decoding on the
smaller StreamCache); ``reference`` takes any function with the arguments of ``stream_reference.answers`` instead.
"""

from __future__ import annotations

import json
import os
import random
import re
from collections.abc import Callable
from pathlib import Path

import torch

INSTRUCTION = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. "
    "I will quiz you about the important information there. "
)
FILLER = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
QUESTION = "What is the pass key?"
ANSWER_PREFIX = "The pass key is"
SINK, WINDOW = 16, 64  # streamed heads keep 80 of the 680-1000 tokens of a prompt
CHAT = False  # passkey as plain completion: SmolLM2-Instruct answers it 5 of 5 so, 1 of 5 inside its chat template
PROMPTS, MAX_NEW_TOKENS, SEED = 10, 8, 0
PATTERN_SEED = 1  # a third of SmolLM2's KV groups whose streaming leaves some passkeys found


def passkey_context(rng: random.Random) -> tuple[str, str]:
    """(instruction + haystack with a 5-digit key at a depth in [0.1, 0.8], the key): about 680-1000 tokens."""
    key = str(rng.randrange(10000, 100000))
    repeats = rng.randrange(22, 41)
    depth = round(repeats * rng.uniform(0.1, 0.8))
    needle = f"The pass key is {key}. Remember it. {key} is the pass key. "
    return INSTRUCTION + FILLER * depth + needle + FILLER * (repeats - depth), key


def pipeline_ids(tokenizer, context: str, question: str, chat: bool) -> tuple[list[int], list[int]]:
    """(context ids, question ids) as kvpress's pipeline builds them (its preprocess: the chat template split at the
    context's end, or without one BOS + context and a newline)."""
    if not chat or tokenizer.chat_template is None:
        context, suffix = (tokenizer.bos_token or "") + context, "\n"
    else:
        separator = "#" * (len(context) + 10)
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": context + separator}], add_generation_prompt=True, tokenize=False, enable_thinking=False
        )
        context, suffix = text.split(separator)
    return (
        tokenizer.encode(context, add_special_tokens=False),
        tokenizer.encode(question + suffix + ANSWER_PREFIX, add_special_tokens=False),
    )


def passkey_prompts(tokenizer, n: int, seed: int, chat: bool = CHAT) -> list[dict]:
    """``n`` passkey prompts with their expected key and the pipeline's token ids."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        context, key = passkey_context(rng)
        context_ids, question_ids = pipeline_ids(tokenizer, context, QUESTION, chat)
        prompts.append(
            {"context": context, "question": QUESTION, "answer_prefix": ANSWER_PREFIX, "answer": key,
             "context_ids": context_ids, "question_ids": question_ids}
        )  # fmt: skip
    return prompts


def patterns(layers: int, kv_heads: int, seed: int) -> dict[str, torch.Tensor]:
    """{name: (layers, KV heads) streamed bool}: none, a seeded third of the KV groups, all."""
    gen = torch.Generator().manual_seed(seed)
    third = torch.zeros(layers * kv_heads, dtype=torch.bool)
    third[torch.randperm(layers * kv_heads, generator=gen)[: round(layers * kv_heads / 3)]] = True
    third = third.view(layers, kv_heads)
    return {"full": torch.zeros(layers, kv_heads, dtype=torch.bool), "third": third, "all": torch.ones(layers, kv_heads, dtype=torch.bool)}


def first_number(text: str) -> str | None:
    """The first run of digits in an answer (the retrieved key), or None."""
    found = re.search(r"\d+", text)
    return found.group(0) if found else None


def accuracy(answers: list[str], prompts: list[dict]) -> float:
    """Share of answers whose first number is the prompt's key."""
    return sum(first_number(a) == p["answer"] for a, p in zip(answers, prompts)) / len(prompts)


def kvpress_job(out: Path, n: int = PROMPTS, reference: Callable | None = None) -> dict:
    """Write the patterns and the prompts for SmolLM2, and compute the references: the job for clients/client_kvpress.py."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from clients.stream_reference import answers as explicit_mask_answers
    from clients.stream_reference import gated_answers
    from headprune.export.kvpress import kv_shape, write_kvpress_pattern
    from headprune.models.embedded import embedded_model_dir

    reference = reference or gated_answers
    folder = embedded_model_dir("smollm2")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = passkey_prompts(tokenizer, n, SEED)
    shape = kv_shape(model.config)
    jobs, references = [], {}
    for name, streamed in patterns(*shape, PATTERN_SEED).items():
        write_kvpress_pattern(out / name, (~streamed).float(), SINK, WINDOW, str(folder), shape=shape)
        ids = {str(layer): torch.nonzero(row).flatten().tolist() for layer, row in enumerate(streamed)}
        jobs.append({"name": name, "dir": str(out / name), "streamed": int(streamed.sum()), "streamed_ids": ids})
        kvpress_like = explicit_mask_answers(model, tokenizer, prompts, streamed, SINK, WINDOW, True, MAX_NEW_TOKENS)
        ours = kvpress_like if name == "full" else reference(model, tokenizer, prompts, streamed, SINK, WINDOW, False, MAX_NEW_TOKENS)
        references[name] = {"kvpress_mask": kvpress_like, "headprune": ours}
    return {
        "model_dir": str(folder),
        "chat_template": CHAT,
        "max_new_tokens": MAX_NEW_TOKENS,
        "prompts": prompts,
        "patterns": jobs,
        "references": references,
    }


def expected_hidden(streamed_ids: dict[str, list[int]], context: int) -> list[dict[str, list[int]]]:
    """Per layer, the keys kvpress should hide for a context of ``context`` tokens: each streamed KV head's positions
    sink .. context - window ({KV head: [first, last + 1, count]}, as clients/client_kvpress.hidden_keys reports them)."""
    span = [SINK, context - WINDOW, context - WINDOW - SINK]
    return [{str(h): span for h in sorted(streamed_ids[str(layer)])} for layer in range(len(streamed_ids))]


def compare(job: dict, result: dict) -> list[dict]:
    """The check rows (client, file, check, passed, detail) of kvpress's answers against the references."""
    rows = []
    for pattern in job["patterns"]:
        name, got, refs = pattern["name"], result["patterns"][pattern["name"]], job["references"][pattern["name"]]
        file = f"smollm2 {name} ({pattern['streamed']} KV groups streamed, sink {SINK}, window {WINDOW})"

        def row(check: str, passed, detail: str) -> None:
            rows.append({"client": "kvpress", "file": file, "check": check, "passed": passed, "detail": detail})

        row("pattern read", got["mask_equal"] and got["ids_equal"],
            f"press streams the file's KV groups: {got['mask_equal']}; token ids as built here: {got['ids_equal']}")  # fmt: skip
        expected = [expected_hidden(pattern["streamed_ids"], len(p["context_ids"])) for p in job["prompts"]]
        exact = sum(a == b for a, b in zip(got["hidden"], expected))
        row("hidden positions", exact == len(expected),
            f"{exact} of {len(expected)} prompts: the press hid exactly keys {SINK} .. context - {WINDOW} of the file's streamed KV heads")  # fmt: skip
        same = sum(a == b for a, b in zip(got["answers"], refs["kvpress_mask"]))
        what = "the unpruned model's" if name == "full" else "an explicit mask's (full prefill, then sink + context window)"
        row("answers", same == len(got["answers"]), f"{same} of {len(got['answers'])} equal {what}")
        ours = accuracy(refs["headprune"], job["prompts"])
        detail = f"kvpress {got['accuracy']:.2f}, headprune {ours:.2f}"
        if name == "full":
            row("passkey accuracy", got["accuracy"] == ours, detail)
        else:
            row("passkey accuracy", None, f"{detail} (streamed in prefill too; kvpress streams after prefill only)")
    return rows


def kvpress_rows(clients: Path, out: Path, n: int = PROMPTS, reference: Callable | None = None) -> list[dict]:
    """Build the kvpress venv, the job, run the client; the check rows ([] with a message when the venv cannot be built)."""
    from clients.env import ensure_kvpress_env, run_client

    clients, out = clients.resolve(), out.resolve()
    python = ensure_kvpress_env(clients)
    if python is None:
        return []
    out.mkdir(parents=True, exist_ok=True)
    job = kvpress_job(out, n, reference)
    (out / "job.json").write_text(json.dumps(job), encoding="utf-8")
    script = Path(__file__).with_name("client_kvpress.py")
    threads = os.environ.get("OMP_NUM_THREADS", "1")
    done = run_client(python, script, [str(out / "job.json"), str(out / "answers.json")], out, OMP_NUM_THREADS=threads)
    if done.returncode != 0:
        return [{"client": "kvpress", "file": "smollm2", "check": "client ran", "passed": False, "detail": f"exit {done.returncode}"}]
    return compare(job, json.loads((out / "answers.json").read_text(encoding="utf-8")))
