"""Run an ONNX export directory from raw text with onnxruntime, tokenizers and numpy alone (no torch, transformers or headprune)."""

import json
import sys
from pathlib import Path


class OnnxDirectory:
    """A self-contained export directory: its tokenizer, its description and an ONNX Runtime session of ``model.onnx``."""

    def __init__(self, directory, threads: int = 1):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.dir = Path(directory)
        self.description = json.loads((self.dir / "headprune_export.json").read_text())
        if "model" not in self.description["graphs"]:
            raise ValueError(f"{self.dir} holds {sorted(self.description['graphs'])}: this client runs one model.onnx graph")
        self.recipe = self.description["text_inputs"]
        self.tokenizer = Tokenizer.from_file(str(self.dir / self.recipe["tokenizer"]))
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        graph = self.description["graphs"]["model"]
        self.session = ort.InferenceSession(str(self.dir / graph["file"]), options, providers=["CPUExecutionProvider"])
        self.input_names = [i["name"] for i in graph["inputs"]]

    def token_ids(self, text) -> tuple[list[int], list[int]]:
        """(ids, type ids) of one text or [text, text_pair], as the description says."""
        pair = list(text) if isinstance(text, (list, tuple)) else [text]
        encoding = self.tokenizer.encode(*pair, add_special_tokens=self.recipe["add_special_tokens"])
        first = [] if self.recipe["prepend_token_id"] is None else [int(self.recipe["prepend_token_id"])]
        return first + encoding.ids, [0] * len(first) + encoding.type_ids

    def inputs(self, texts: list) -> dict:
        """The graph's int64 inputs (B, T) of ``texts``, padded on the right to the longest."""
        import numpy as np

        rows = [self.token_ids(text) for text in texts]
        length, pad = max(len(ids) for ids, _ in rows), int(self.recipe["pad_token_id"] or 0)
        arrays = {
            "input_ids": [ids + [pad] * (length - len(ids)) for ids, _ in rows],
            "attention_mask": [[1] * len(ids) + [0] * (length - len(ids)) for ids, _ in rows],
            "token_type_ids": [types + [0] * (length - len(types)) for _, types in rows],
        }
        return {name: np.array(arrays[name], dtype=np.int64) for name in self.input_names}

    def logits(self, arrays: dict):
        """The graph's logits: (B, labels) for a classifier, (B, T, vocabulary) for a decoder-only LM."""
        return self.session.run(["logits"], arrays)[0]

    def classify(self, texts: list) -> dict:
        """Token ids, logits and label names of ``texts``."""
        arrays = self.inputs(texts)
        logits = self.logits(arrays)
        labels = self.description.get("labels") or {}
        return {
            "ids": [row[: int(m.sum())].tolist() for row, m in zip(arrays["input_ids"], arrays["attention_mask"])],
            "logits": logits.tolist(),
            "labels": [labels.get(str(i), str(i)) for i in logits.argmax(-1).tolist()],
        }

    def eos_ids(self) -> list[int]:
        """The ids that end generation: generation_config.json's, else config.json's."""
        for name in ("generation_config.json", "config.json"):
            path = self.dir / name
            eos = json.loads(path.read_text()).get("eos_token_id") if path.is_file() else None
            if eos is not None:
                return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        return []

    def continue_text(self, texts: list, new_tokens: int) -> dict:
        """Each text's ids, last-position logits and greedy continuation (ids and text), one text at a time."""
        import numpy as np

        eos = self.eos_ids()
        out = {"ids": [], "last_logits": [], "new_ids": [], "new_text": []}
        for text in texts:
            ids = np.array([self.token_ids(text)[0]], dtype=np.int64)  # (1, T)
            out["ids"].append(ids[0].tolist())
            new = []
            for step in range(new_tokens):
                logits = self.logits({"input_ids": ids, "attention_mask": np.ones_like(ids)})[0, -1]  # (V,)
                if step == 0:
                    out["last_logits"].append(logits.tolist())
                token = int(logits.argmax())
                new.append(token)
                ids = np.concatenate([ids, [[token]]], axis=1)
                if token in eos:
                    break
            out["new_ids"].append(new)
            out["new_text"].append(self.tokenizer.decode(new))
        return out


def main(directory: str, requests: str) -> None:
    """Answer ``requests`` with the export in ``directory``; print the answer and the top-level modules loaded."""
    asked = json.loads(Path(requests).read_text())
    export = OnnxDirectory(directory)
    if export.description["task"] == "text-classification":
        answer = export.classify(asked["texts"])
    else:
        answer = export.continue_text(asked["texts"], int(asked["new_tokens"]))
    answer["modules"] = sorted({name.partition(".")[0] for name in sys.modules})
    print(json.dumps(answer))


if __name__ == "__main__":
    main(*sys.argv[1:3])
