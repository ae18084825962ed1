"""A tokenizer saved so that transformers 4.x and 5.x both load it: ``PreTrainedTokenizerFast`` over ``tokenizer.json``."""

import json
from pathlib import Path

PORTABLE_CLASS = "PreTrainedTokenizerFast"
V5_ONLY = ("TokenizersBackend",)


def prefix_space(pre_tokenizer: dict | None) -> bool | None:
    """The ``add_prefix_space`` of a tokenizer.json pre-tokenizer (in a Sequence too), or None when it has none."""
    if not isinstance(pre_tokenizer, dict):
        return None
    if "add_prefix_space" in pre_tokenizer:
        return bool(pre_tokenizer["add_prefix_space"])
    found = [prefix_space(p) for p in pre_tokenizer.get("pretokenizers") or []]
    return next((f for f in found if f is not None), None)


def save_tokenizer(tokenizer, out: Path, pad_to_longest: bool = False) -> None:
    """``tokenizer.save_pretrained(out)``, its config naming a class transformers 4 and 5 both load; ``pad_to_longest``:
    tokenizer.json pads a batch to its longest row (the ONNX directory's, read by ``tokenizers`` alone)."""
    tokenizer.save_pretrained(out)
    path, files = Path(out) / "tokenizer_config.json", Path(out) / "tokenizer.json"
    if not files.is_file():
        return
    if pad_to_longest and tokenizer.pad_token_id is not None:
        from tokenizers import Tokenizer

        backend = Tokenizer.from_file(str(files))
        backend.enable_padding(pad_id=tokenizer.pad_token_id, pad_token=tokenizer.pad_token)  # no length: the batch's longest
        backend.save(str(files))
    if not path.is_file():
        return
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("tokenizer_class") in (*V5_ONLY, None):
        config["tokenizer_class"] = PORTABLE_CLASS
        config.pop("backend", None)  # 5's choice among its backends: tokenizer.json says it
        prefix = prefix_space(json.loads(files.read_text(encoding="utf-8")).get("pre_tokenizer"))
        if prefix is not None and "add_prefix_space" not in config:
            config["add_prefix_space"] = prefix  # 4's PreTrainedTokenizerFast resets the pre-tokenizer's to false unless told
        path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
