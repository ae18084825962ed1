"""The check of an export, run as a script in a fresh interpreter that cannot import headprune."""

import importlib.util
import json
import sys
from pathlib import Path


class OnnxRunner:
    """An ONNX export run by ONNX Runtime: ``model.onnx`` (one graph to logits) or ``encoder.onnx`` + ``decoder.onnx``."""

    def __init__(self, files: dict, threads: int = 1):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.sessions = {name: ort.InferenceSession(path, options, providers=["CPUExecutionProvider"]) for name, path in files.items()}
        self.inputs = {name: [i.name for i in s.get_inputs()] for name, s in self.sessions.items()}

    def _run(self, name: str, arrays: dict):
        return self.sessions[name].run(None, {k: arrays[k] for k in self.inputs[name]})[0]

    def logits(self, batch: dict):
        """Logits (numpy) of a batch of numpy int64 inputs; an encoder-decoder runs its encoder, then its decoder once."""
        if "model" in self.sessions:
            return self._run("model", batch)
        hidden = self._run("encoder", batch)
        return self._run("decoder", {**batch, "encoder_hidden_states": hidden})


def greedy_loop(next_logits, prompt, new_tokens: int, eos: list[int], pad: int):
    """Greedy decoding without a cache: append the argmax of the last position until ``new_tokens`` or every row hit EOS."""
    import numpy as np

    ids = prompt.astype(np.int64)
    done = np.zeros(len(ids), dtype=bool)
    for _ in range(new_tokens):
        logits = next_logits(ids, np.ones_like(ids))[:, -1]  # (B, V)
        token = np.where(done, pad, logits.argmax(-1))
        ids = np.concatenate([ids, token[:, None]], axis=1)
        done |= np.isin(token, eos)
        if done.all():
            break
    return ids[:, prompt.shape[1] :]


class Loaded:
    """An export as the check runs it: logits of a batch, greedy new tokens of a prompt, its tokenizer (or None), the reader's report."""

    def __init__(self, logits, greedy, tokenizer=None, report: dict | None = None):
        self.logits, self.greedy, self.tokenizer, self.report = logits, greedy, tokenizer, report or {}


class FileTokenizer:
    """The ``tokenizer.json`` beside ONNX graphs, read by the ``tokenizers`` library alone, called as transformers' tokenizers are."""

    def __init__(self, path):
        from tokenizers import Tokenizer

        self.backend = Tokenizer.from_file(str(path))

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        return {"input_ids": self.backend.encode(text, add_special_tokens=add_special_tokens).ids}


def read_onnx(job: dict) -> Loaded:
    """ONNX graphs in ONNX Runtime (with the tokenizer.json beside them); greedy decoding runs the whole sequence again per token."""
    runner = OnnxRunner(job["files"])
    folder = Path(next(iter(job["files"].values()))).parent
    tokenizer = FileTokenizer(folder / "tokenizer.json") if (folder / "tokenizer.json").is_file() else None
    step = lambda ids, mask: runner.logits({"input_ids": ids, "attention_mask": mask})  # noqa: E731
    providers = sorted({p for s in runner.sessions.values() for p in s.get_providers()})
    return Loaded(
        runner.logits,
        lambda prompt: greedy_loop(step, prompt, job["new_tokens"], job["eos"], job["pad"]),
        tokenizer,
        {"providers": providers, "tokenizer": "tokenizers (tokenizer.json)" if tokenizer else None},
    )


def read_transformers(job: dict) -> Loaded:
    """A directory (or a GGUF file in it) loaded by stock transformers' auto class, with its tokenizer."""
    import torch
    import transformers

    auto = getattr(transformers, job["auto_class"])
    extra = {"gguf_file": job["gguf_file"]} if job.get("gguf_file") else {}
    model = auto.from_pretrained(job["dir"], dtype=torch.float32, **extra).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(job["dir"], **extra) if job.get("tokenizer", True) else None

    def logits(batch):
        with torch.no_grad():
            return model(**{k: torch.from_numpy(v) for k, v in batch.items()}).logits.float().numpy()

    def greedy(prompt):
        config = transformers.GenerationConfig(
            do_sample=False, max_new_tokens=job["new_tokens"], eos_token_id=job["eos"], pad_token_id=job["pad"]
        )
        with torch.no_grad():
            ids = torch.from_numpy(prompt)
            tokens = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config).numpy()
        return tokens[:, prompt.shape[1] :]

    report = {"architecture": type(model).__name__, "tokenizer": type(tokenizer).__name__ if tokenizer is not None else None}
    return Loaded(logits, greedy, tokenizer, report)


def read_numpy(job: dict) -> Loaded:
    """A deci GGUF file (gguf_numpy.py), or a DeciLMForCausalLM directory with its tokenizer as vLLM loads it
    (decilm_reference.py), run by their numpy forward beside this file (loaded by path), greedy decoding without a cache;
    its layout against the one written."""
    spec = importlib.util.spec_from_file_location("decilm_reference_reader", Path(__file__).with_name("decilm_reference.py"))
    readers = importlib.util.module_from_spec(spec)  # loaded by path: this script cannot import headprune
    spec.loader.exec_module(readers)  # it loads gguf_numpy.py (its GGUFDecoder) by path in turn
    if job.get("gguf_file"):
        decoder = readers.GGUFDecoder(str(Path(job["dir"]) / job["gguf_file"]))
        layout, tokenizer = {key: decoder.layout[key] for key in job["layout"]}, None
        report = {"architecture": job.get("architecture"), "reader": "gguf + numpy"}
    else:
        import transformers

        decoder = readers.DeciLMReference(job["dir"])
        layout, tokenizer = decoder.blocks, None  # the tokenizer as vLLM loads it: the config names its own class (trust_remote_code)
        if job.get("tokenizer", True):
            tokenizer = transformers.AutoTokenizer.from_pretrained(job["dir"], trust_remote_code=True)
        report = {"architecture": "DeciLMForCausalLM", "reader": "torch reference"}
    logits = lambda batch: decoder.logits(batch["input_ids"], batch.get("attention_mask"))  # noqa: E731
    greedy = lambda prompt: greedy_loop(decoder.logits, prompt, job["new_tokens"], job["eos"], job["pad"])  # noqa: E731
    return Loaded(logits, greedy, tokenizer, {**report, "layout": layout, "layout_equal": layout == job["layout"]})


READERS = {
    "onnxruntime": read_onnx,
    "transformers": read_transformers,
    "gguf-numpy": read_numpy,
    "deci-torch": read_numpy,
}  # a job's "reader"


def run_job(job: dict, arrays) -> dict:
    """Outputs of the export on every check batch against the reference, and greedy tokens against the reference tokens."""
    import numpy as np

    names = job["input_names"]
    loaded = READERS[job["reader"]](job)
    diffs, scales, report = [], [], {"format": job["format"], **loaded.report}
    nll = {"export": (0.0, 0.0), "reference": (0.0, 0.0)}  # (summed NLL, tokens) of the check texts
    for b in range(job["batches"]):
        batch = {name: arrays[f"batch{b}.{name}"] for name in names if f"batch{b}.{name}" in arrays}
        reference = arrays[f"reference{b}"]
        out = loaded.logits(batch)
        if out.shape != reference.shape:
            raise AssertionError(f"batch {b}: the export gives logits of shape {out.shape}, the masked model {reference.shape}")
        gap = np.abs(out - reference)
        if job.get("causal"):  # a padding position's logits are no output of the model (sdpa and eager differ there)
            mask = batch.get("attention_mask", np.ones_like(batch["input_ids"]))
            gap = gap[mask.astype(bool)]
        diffs.append(float(gap.max()))
        scales.append(float(np.abs(reference).max()))
        if job.get("causal"):
            for which, logits in (("export", out), ("reference", reference)):
                nll[which] = [x + y for x, y in zip(nll[which], token_nll(logits, batch["input_ids"], mask))]
    report["max_abs_diff"] = max(diffs)
    report["reference_max_abs"] = max(scales)
    report.update(tolerance_of(job, max(scales)))
    report["outputs_match"] = report["max_abs_diff"] <= report["tolerance"]
    if job.get("causal"):
        export, reference = (float(np.exp(total / max(count, 1.0))) for total, count in nll.values())
        report.update(perplexity=export, reference_perplexity=reference, perplexity_rel_diff=abs(export - reference) / reference)
    if "greedy_prompt" in arrays:
        tokens, expected = loaded.greedy(arrays["greedy_prompt"]), arrays["greedy_tokens"]
        report["greedy_tokens"] = tokens.tolist()
        report["greedy_equal"] = tokens.shape == expected.shape and bool((tokens == expected).all())
    if job.get("texts") and loaded.tokenizer is not None:
        encoded = [loaded.tokenizer(text, add_special_tokens=False)["input_ids"] for text in job["texts"]]
        report["tokenizer_equal"] = encoded == job["text_ids"]  # the exported tokenizer splits texts as the model's own
    if job.get("gguf_file"):
        report.update(gguf_pre_report(job))
    report["passed"] = all(report.get(key, True) for key in FAILURES)
    return report


FAILURES = {  # what each false check of a report says of the export (verify.refusal_message)
    "outputs_match": "its logits differ beyond the tolerance",
    "greedy_equal": "its greedy tokens differ",
    "tokenizer_equal": "its tokenizer splits the check texts otherwise",
    "layout_equal": "its per-layer head counts differ",
    "tokenizer_pre_equal": "it names another pre-tokenizer than the model's tokenizer has",
}


def tolerance_of(job: dict, scale: float) -> dict:
    """The tolerance: ``roundoff_multiple`` x the model's measured f32 round-off, at least ``tolerance`` relative to the logits' scale."""
    floor = job["tolerance"] * max(1.0, scale)
    from_roundoff = job.get("roundoff_multiple", 0.0) * job.get("f32_roundoff", 0.0)
    return {
        "tolerance": max(floor, from_roundoff),
        "tolerance_floor": floor,
        "f32_roundoff": job.get("f32_roundoff"),
        "tolerance_from_roundoff": from_roundoff,
        "tolerance_rule": f"max({job['tolerance']:g} x max(1, |reference logits|), {job.get('roundoff_multiple', 0.0):g} x f32 round-off)",
    }


def token_nll(logits, ids, mask) -> tuple[float, float]:
    """(summed negative log-likelihood, tokens) of each next token of a batch (B, T), padding left out, in float64."""
    import numpy as np
    from scipy.special import log_softmax

    logp = log_softmax(logits[:, :-1].astype(np.float64), axis=-1)  # position t predicts token t + 1
    picked = np.take_along_axis(logp, ids[:, 1:, None], -1)[..., 0]
    keep = mask[:, 1:] * mask[:, :-1]
    return float(-(picked * keep).sum()), float(keep.sum())


def gguf_pre_report(job: dict) -> dict:
    """The pre-tokenizer the GGUF file names (llama.cpp splits text by it) against the one chosen for the model's tokenizer."""
    from gguf import GGUFReader

    field = GGUFReader(str(Path(job["dir"]) / job["gguf_file"])).fields.get("tokenizer.ggml.pre")
    written = None if field is None else str(field.contents())
    return {
        "tokenizer_pre": written,
        "tokenizer_pre_expected": job.get("tokenizer_pre"),
        "tokenizer_pre_equal": written == job.get("tokenizer_pre"),
    }


def main(path: str) -> None:
    """Run every job of ``path`` (a list) and print the list of reports as one JSON line."""
    jobs = json.loads(open(path, encoding="utf-8").read())
    sys.path[:0] = [p for p in jobs[0]["site_packages"] if p not in sys.path]
    if importlib.util.find_spec("headprune") is not None:
        raise AssertionError("headprune is importable in the checker's interpreter: the check would not be independent")
    import numpy as np

    reports = []
    for job in jobs:
        with np.load(job["arrays"]) as arrays:
            report = run_job(job, {k: arrays[k] for k in arrays.files})
        reports.append({**report, "headprune_importable": False})
    print(json.dumps(reports))


if __name__ == "__main__":
    main(sys.argv[1])
