"""Open an ONNX export directory with optimum's ORTModel classes (run in a venv with optimum-onnx, not headprune).

    python client_optimum.py <export dir> <requests.json>       (prints one JSON line, as onnx_client.py does)

A classifier goes through ``ORTModelForSequenceClassification`` with the directory's tokenizer loaded by
transformers; a decoder-only LM through ``ORTModelForCausalLM(use_cache=False)`` (the graphs take no KV cache).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(directory: str, requests: str) -> None:
    """Answer ``requests`` with optimum; print ids, logits and labels (or greedy tokens) and the modules loaded."""
    import torch
    from transformers import AutoTokenizer

    asked = json.loads(Path(requests).read_text())
    description = json.loads((Path(directory) / "headprune_export.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(directory)
    if description["task"] == "text-classification":
        from optimum.onnxruntime import ORTModelForSequenceClassification

        model = ORTModelForSequenceClassification.from_pretrained(directory)
        pairs = [list(t) if isinstance(t, (list, tuple)) else [t] for t in asked["texts"]]
        batch = tokenizer(*zip(*pairs), padding=True, return_tensors="pt")
        logits = model(**batch).logits
        answer = {
            "ids": [row[: int(m.sum())].tolist() for row, m in zip(batch["input_ids"], batch["attention_mask"])],
            "logits": logits.tolist(),
            "labels": [model.config.id2label[int(i)] for i in logits.argmax(-1)],
        }
    else:
        from optimum.onnxruntime import ORTModelForCausalLM

        model = ORTModelForCausalLM.from_pretrained(directory, use_cache=False, use_io_binding=False)
        first = description["text_inputs"]["prepend_token_id"]
        answer = {"ids": [], "last_logits": [], "new_ids": []}
        for text in asked["texts"]:
            ids = torch.tensor([([] if first is None else [first]) + tokenizer(text, add_special_tokens=False)["input_ids"]])
            mask = torch.ones_like(ids)
            answer["ids"].append(ids[0].tolist())
            answer["last_logits"].append(model(input_ids=ids, attention_mask=mask).logits[0, -1].tolist())
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=int(asked["new_tokens"]), do_sample=False)
            answer["new_ids"].append(out[0, ids.shape[1] :].tolist())
    answer["modules"] = sorted({name.partition(".")[0] for name in sys.modules})
    print(json.dumps(answer))


if __name__ == "__main__":
    main(*sys.argv[1:3])
