"""The tokenizer follows the token rows: the floor a tokenizer needs, and its ``tokenizer.json`` rewritten to the kept ids.

Byte-level BPE loses every merge whose result or either input was removed, so it never produces a removed id and still
spells any text from its 256 byte tokens; WordPiece keeps its greedy longest match over the kept pieces, else [UNK].
Unigram (SentencePiece) scores whole segmentations by piece probabilities: it is refused.
"""

import json
from pathlib import Path

from headprune.core.checks import ConfigError


def tokenizer_json(tokenizer) -> dict:
    """The HF ``tokenizers`` description of a fast tokenizer, or a ConfigError for any other."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(
            f"prune.unit=vocab rewrites the tokenizer's tokenizer.json, and {type(tokenizer).__name__} is no fast tokenizer: "
            "load the model's tokenizer with use_fast=True"
        )
    return json.loads(backend.to_str())


def check_rewritable(data: dict) -> str:
    """The tokenizer model's type (BPE or WordPiece), or a ConfigError naming it."""
    kind = data["model"]["type"]
    if kind not in ("BPE", "WordPiece"):
        raise ConfigError(
            f"prune.unit=vocab cannot rewrite a {kind} tokenizer ({'SentencePiece-style ' if kind == 'Unigram' else ''}segmentation "
            f"by whole-piece scores would still reach removed pieces): it takes byte-level BPE and WordPiece tokenizers"
        )
    return kind


def floor_ids(tokenizer, needed: list[int] = ()) -> list[int]:
    """The ids never removed: special tokens, the tokenizer's base characters, and ``needed`` (the task's labels and prompts)."""
    data = tokenizer_json(tokenizer)
    check_rewritable(data)
    special = [int(t["id"]) for t in data.get("added_tokens", []) if t.get("special")] + list(tokenizer.all_special_ids)
    prefix = data["model"].get("continuing_subword_prefix") or ""
    vocab = data["model"]["vocab"]  # its base: single characters (byte-level BPE's 256 bytes; WordPiece's characters and ##c)
    base = [int(i) for t, i in vocab.items() if len(t) == 1 or (prefix and t.startswith(prefix) and len(t) == len(prefix) + 1)]
    return sorted({*special, *base, *(int(i) for i in needed)})


def merge_pair(merge) -> tuple[str, str]:
    """The (left, right) of a BPE merge written "a b" or ["a", "b"]."""
    return tuple(merge.split(" ", 1)) if isinstance(merge, str) else (merge[0], merge[1])


def merged(left: str, right: str, prefix: str) -> str:
    """The token a BPE merge of ``left`` and ``right`` makes (``right``'s continuing-subword ``prefix`` dropped)."""
    return left + (right[len(prefix) :] if prefix and right.startswith(prefix) else right)


def _renumber_processor(node, mapping: dict[int, int]):
    """A post-processor with its special-token ids renumbered (Template, Bert, Roberta processors and sequences of them)."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "ids" and isinstance(value, list) and all(isinstance(v, int) for v in value):
                out[key] = [mapping[v] for v in value]
            elif key in ("sep", "cls") and isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
                out[key] = [value[0], mapping[value[1]]]
            else:
                out[key] = _renumber_processor(value, mapping)
        return out
    return [_renumber_processor(v, mapping) for v in node] if isinstance(node, list) else node


def rewrite_tokenizer_json(data: dict, kept_ids: list[int]) -> dict:
    """``data`` (a tokenizer.json) keeping only ``kept_ids`` (original ids), renumbered densely in their original order."""
    kind = check_rewritable(data)
    mapping = {old: new for new, old in enumerate(sorted(kept_ids))}
    model = dict(data["model"])
    model["vocab"] = {token: mapping[i] for token, i in model["vocab"].items() if i in mapping}
    if kind == "BPE":  # a merge stays iff its two parts and its result stay
        prefix, kept = model.get("continuing_subword_prefix") or "", model["vocab"].keys()
        pairs = [(merge, merge_pair(merge)) for merge in model.get("merges", [])]
        model["merges"] = [merge for merge, (left, right) in pairs if {left, right, merged(left, right, prefix)} <= kept]
    added = [{**t, "id": mapping[t["id"]]} for t in data.get("added_tokens", []) if t["id"] in mapping]
    processor = _renumber_processor(data.get("post_processor"), mapping)
    return {**data, "model": model, "added_tokens": added, "post_processor": processor}


def rewritten_tokenizer(tokenizer, kept_ids: list[int]):
    """A fast tokenizer like ``tokenizer`` over ``kept_ids`` only, ids renumbered (the one a pruned model ships)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer.from_str(json.dumps(rewrite_tokenizer_json(tokenizer_json(tokenizer), kept_ids)))
    specials = {k: v for k, v in tokenizer.special_tokens_map.items() if isinstance(v, str)}
    sides = {"padding_side": tokenizer.padding_side, "truncation_side": tokenizer.truncation_side}
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=tokenizer.model_max_length, **sides, **specials)


def rewrite_saved_tokenizer(path, kept_ids: list[int]) -> None:
    """Rewrite the tokenizer files save_pretrained wrote to ``path`` to the kept ids (tokenizer.json, tokenizer_config.json, vocab files)."""
    path = Path(path)
    file = path / "tokenizer.json"
    if not file.exists():
        raise ConfigError(f"{path} holds no tokenizer.json to rewrite to the kept tokens: save the model with a fast tokenizer")
    data = rewrite_tokenizer_json(json.loads(file.read_text()), kept_ids)
    file.write_text(json.dumps(data, ensure_ascii=False, indent=1))
    mapping = {old: new for new, old in enumerate(sorted(kept_ids))}
    config = path / "tokenizer_config.json"
    if config.exists():
        settings = json.loads(config.read_text())
        decoder = settings.get("added_tokens_decoder") or {}
        settings["added_tokens_decoder"] = {str(mapping[int(k)]): v for k, v in decoder.items() if int(k) in mapping}
        config.write_text(json.dumps(settings, ensure_ascii=False, indent=1))
    by_id = sorted(data["model"]["vocab"].items(), key=lambda item: item[1])
    if (path / "vocab.txt").exists():  # WordPiece's slow files: one token a line, by id
        (path / "vocab.txt").write_text("".join(token + "\n" for token, _ in by_id))
    if (path / "vocab.json").exists():
        (path / "vocab.json").write_text(json.dumps(dict(by_id), ensure_ascii=False))
    if (path / "merges.txt").exists():
        lines = [" ".join(merge_pair(m)) for m in data["model"].get("merges", [])]
        (path / "merges.txt").write_text("#version: 0.2\n" + "".join(line + "\n" for line in lines))
