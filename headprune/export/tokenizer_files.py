"""A tokenizer saved so that transformers 4.x and 5.x both load it: ``PreTrainedTokenizerFast`` over ``tokenizer.json``.

transformers 5 saves a tokenizer without a dedicated class as ``"tokenizer_class": "TokenizersBackend"`` (with
``"backend": "tokenizers"``), a class transformers 4 does not have: a client pinned below 5 (a vLLM release, optimum)
fails at start-up. ``PreTrainedTokenizerFast`` is the class both read from ``tokenizer.json`` (in 5, a name of
``TokenizersBackend``); a tokenizer saved with its own class (``GPT2Tokenizer``, ``LlamaTokenizer``) keeps it.
"""

from __future__ import annotations

import json
from pathlib import Path

PORTABLE_CLASS = "PreTrainedTokenizerFast"
V5_ONLY = ("TokenizersBackend",)


def save_tokenizer(tokenizer, out: Path) -> None:
    """``tokenizer.save_pretrained(out)``, its config naming a class transformers 4 and 5 both load."""
    tokenizer.save_pretrained(out)
    path = Path(out) / "tokenizer_config.json"
    if not (path.is_file() and (Path(out) / "tokenizer.json").is_file()):
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") in (*V5_ONLY, None):
        config["tokenizer_class"] = PORTABLE_CLASS
        config.pop("backend", None)  # 5's choice among its backends: tokenizer.json says it
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
