"""Check an ONNX export directory from raw text, as its users run it: onnxruntime and tokenizers, nothing else."""

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

from headprune.export.verify import run_fresh

CLIENT = Path(__file__).with_name("onnx_client.py")
BLOCKED = ("torch", "transformers", "headprune")
TOLERANCE = 1e-5  # f32: largest |client - reference| over the logits' scale (at least 1)
BOOTSTRAP = """
import runpy, sys
blocked = set(sys.argv[1].split(","))
class Refused:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ImportError(f"{name} is not available to this client")
sys.meta_path.insert(0, Refused())
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def run_client(
    directory: Path,
    texts: list,
    new_tokens: int = 8,
    python: str | None = None,
    timeout: float = 600.0,
    client: Path = CLIENT,
    blocked: tuple = BLOCKED,
) -> dict:
    """The answer of ``client`` (``onnx_client.py``) for ``texts`` from the export in ``directory``, the ``blocked`` modules refused."""
    with tempfile.TemporaryDirectory(prefix="headprune-client-") as folder:
        requests = Path(folder) / "requests.json"
        requests.write_text(json.dumps({"texts": texts, "new_tokens": new_tokens}))
        command = [python or sys.executable, "-I", "-c", BOOTSTRAP, ",".join(blocked), str(client), str(directory), str(requests)]
        return run_fresh(command, Path(folder), f"the ONNX client {Path(client).name}", timeout)


def masked_predictions(model: nn.Module, tokenizer, texts: list, description: dict, new_tokens: int = 8) -> dict:
    """The client's answer computed with transformers' tokenizer and the model in PyTorch (call it under the mask)."""
    from headprune.export.verify import greedy_tokens

    model.eval()
    device = next(model.parameters()).device
    if description["task"] == "text-classification":
        pairs = [list(t) if isinstance(t, (list, tuple)) else [t] for t in texts]
        batch = tokenizer(*zip(*pairs), padding=True, return_tensors="pt")
        logits = model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu()
        return {
            "ids": [row[: int(m.sum())].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])],
            "logits": logits.tolist(),
            "labels": [model.config.id2label[i] for i in logits.argmax(-1).tolist()],
        }
    first = description["text_inputs"]["prepend_token_id"]
    out = {"ids": [], "last_logits": [], "new_ids": []}
    for text in texts:
        ids = ([] if first is None else [first]) + tokenizer(text, add_special_tokens=False)["input_ids"]
        prompt = torch.tensor([ids])
        out["ids"].append(ids)
        out["last_logits"].append(model(input_ids=prompt.to(device)).logits[0, -1].float().cpu().tolist())
        out["new_ids"].append(greedy_tokens(model, prompt, new_tokens)[0].tolist())
    return out


def compare_predictions(client: dict, reference: dict, tolerance: float = TOLERANCE, blocked: tuple = BLOCKED) -> dict:
    """Ids, logits (within ``tolerance`` of their scale), labels or greedy tokens of the client against the reference."""
    key = "logits" if "logits" in reference else "last_logits"
    ours, theirs = np.asarray(client[key]), np.asarray(reference[key])
    report = {"ids_equal": client["ids"] == reference["ids"], "shape_equal": ours.shape == theirs.shape}
    report["max_abs_diff"] = float(np.abs(ours - theirs).max()) if report["shape_equal"] else float("inf")
    report["tolerance"] = tolerance * max(1.0, float(np.abs(theirs).max()))
    report["outputs_match"] = report["max_abs_diff"] <= report["tolerance"]
    if "labels" in reference:
        report["labels_equal"] = client["labels"] == reference["labels"]
    if "new_ids" in reference:
        report["greedy_equal"] = client["new_ids"] == reference["new_ids"]
    report["blocked_loaded"] = sorted(set(client["modules"]) & set(blocked))
    agree = all(report.get(key, True) for key in ("ids_equal", "outputs_match", "labels_equal", "greedy_equal"))
    report["passed"] = agree and not report["blocked_loaded"]
    return report
