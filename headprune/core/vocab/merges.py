"""Which tokens a BPE tokenizer can still produce once some are removed: each token's merge, and merge-closed rankings.

BPE applies the lowest-ranked merge of two neighbours until none applies, so a token is produced iff its own string merges
to it, and a rewritten tokenizer (``rewrite_tokenizer_json`` keeps a merge iff its inputs and result stay) still produces
it iff its last merge's two parts stay and, recursively, theirs. WordPiece matches kept pieces greedily: no parts.
"""

import math

import numpy as np
import torch

from headprune.core.vocab.tokenizer import merge_pair, merged, tokenizer_json


def _derive(symbols: list[str], ranks: dict, prefix: str) -> tuple[str, str] | None | bool:
    """The last merge (left, right) BPE applies to ``symbols``; None: one symbol; False: more than one stays (no text makes it)."""
    last = None
    while len(symbols) > 1:
        found = [(ranks.get((a, b), math.inf), i) for i, (a, b) in enumerate(zip(symbols, symbols[1:]))]
        rank, i = min(found)
        if rank == math.inf:
            return False
        left, right = symbols[i], symbols[i + 1]
        symbols[i : i + 2] = [merged(left, right, prefix)]
        last = (left, right)
    return last


def merge_parts(data: dict) -> tuple[dict[int, tuple[int, int]], set[int]]:
    """({id: (left id, right id)} of each BPE token its last merge makes, the ids no text produces) of a tokenizer.json.

    Single characters, added tokens (matched whole) and WordPiece pieces (each produced by its own word) are in neither."""
    model = data["model"]
    if model["type"] != "BPE":
        return {}, set()
    vocab, prefix = model["vocab"], model.get("continuing_subword_prefix") or ""
    ranked = reversed(list(enumerate(model.get("merges", []))))  # {(left, right): rank}; a pair listed twice: its first rank
    ranks = {merge_pair(merge): rank for rank, merge in ranked}
    added = {int(t["id"]) for t in data.get("added_tokens", [])}
    parts, dead = {}, set()
    for token, index in vocab.items():
        if index in added or not token:
            continue
        if prefix and token.startswith(prefix) and len(token) > len(prefix):  # a piece inside a word: every character continues
            symbols = [prefix + c for c in token[len(prefix) :]]
        else:  # the characters BPE starts the token's string from (after the first, each with the continuing-subword prefix)
            symbols = [token[0], *(prefix + c for c in token[1:])]
        last = _derive(symbols, ranks, prefix)
        if last is False or any(c not in vocab for c in symbols):
            dead.add(int(index))
        elif last is not None:
            left, right = last
            parts[int(index)] = (int(vocab[left]), int(vocab[right]))
    return parts, dead


def merge_closed_scores(scores: torch.Tensor, parts: dict[int, tuple[int, int]], dead: set[int]) -> torch.Tensor:
    """``scores`` ([V], +inf: never removed) re-ranked so that removing the lowest first always keeps every kept token's parts.

    Tokens are walked from the highest score down; each brings its parts (recursively) not yet walked just before it, and a
    token no text produces comes last. Each takes the score of the token that brought it, lowered by an ulp where needed so
    the walk is strictly decreasing: any count of the top tokens is a walk's prefix, closed under parts. +inf stays +inf.
    """
    values = scores.detach().double().cpu()
    order = sorted(range(len(values)), key=lambda i: (-float(values[i]), i))
    walked, walk = set(), []  # walk: (token, the score it is kept at)

    def bring(token: int, score: float):  # post-order: a token's left parts, then its right parts, then the token
        if token not in walked:
            for part in parts.get(token, ()):
                bring(part, score)
            walked.add(token)
            walk.append((token, score))

    for token in order:
        if token not in walked and (token not in dead or values[token] == math.inf):
            bring(token, float(values[token]))
    walk += [(token, float(values[token])) for token in order if token not in walked]  # no text produces it: removed first
    kind = np.dtype(np.float64 if scores.dtype == torch.float64 else np.float32)  # strict in the precision the masks compare
    out, previous, lowest = np.empty(len(values), dtype=kind), kind.type(math.inf), kind.type(-math.inf)
    for token, score in walk:
        score = kind.type(score)
        if score != math.inf:
            score = min(score, np.nextafter(previous, lowest))
        out[token] = previous = score
    return torch.from_numpy(out).to(scores.device)


def produced_ids(tokenizer) -> list[int]:
    """The ids some text makes a fast ``tokenizer`` produce: added tokens, BPE tokens their own string merges to, WordPiece's all."""
    data = tokenizer_json(tokenizer)
    added = {int(t["id"]) for t in data.get("added_tokens", [])}
    vocab = data["model"]["vocab"]
    if data["model"]["type"] != "BPE":
        return sorted(added | {int(i) for i in vocab.values()})
    model = tokenizer.backend_tokenizer.model
    reached = {int(i) for token, i in vocab.items() if [t.id for t in model.tokenize(token)] == [int(i)]}
    return sorted(added | reached)
