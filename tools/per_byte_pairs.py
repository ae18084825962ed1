"""Paired per-byte comparisons of the points of one LM prune run, whose points may read the text through other tokenizers.

A cut vocabulary splits the same `eval` text into other tokens, so two points compare per byte: each text's summed NLL
(``per_example["nll"]``) over the UTF-8 bytes its scored tokens cover, which the run's data rebuilds. For each pair it
prints the perplexity-per-byte ratio and the bits-per-byte ratio with paired bootstrap intervals over the texts, and,
where both points read the texts through one tokenizer (the same token counts), the per-token perplexity ratio beside:

    python tools/per_byte_pairs.py docs/results/llm_vocab16k_distill_wide.json
    python tools/per_byte_pairs.py docs/results/llm_vocab16k_distill.json docs/results/llm_vocab16k_distill_wide.json

Given several runs (which must score the same bytes of the same texts), it pairs the points of all of them, each named
after its file.
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
from omegaconf import OmegaConf

import headprune.conf_dir  # noqa: F401  (registers the configs' resolvers)
from headprune.models.build import build_tokenizer
from headprune.results.points import point_name
from headprune.scoring.paired_outcomes import bootstrap_perplexity_ratio, point_perplexity_ratio
from headprune.tasks.lm.data import load_texts
from headprune.tasks.lm.task import lm_data


def scored_bytes(cfg, split: str) -> list[int]:
    """The UTF-8 bytes each text of ``split`` is scored on, as the run's unpruned tokenizer and data settings draw them."""
    if cfg.data.get("document_tokens") is not None:
        raise SystemExit(
            "a run on long documents (data.document_tokens) joins its texts in the model's tokens: its bytes are not rebuilt here"
        )
    return lm_data(cfg, {split: load_texts(cfg.data)[split]}, build_tokenizer(cfg.model)).scored_bytes(split)


def bits_ratio(nll: np.ndarray, other: np.ndarray, draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """sum(nll) / sum(other) (the bits-per-byte ratio on the same bytes) with its 95% percentile bootstrap over texts."""
    picks = np.random.default_rng(seed).integers(0, len(nll), size=(draws, len(nll)))  # (draws, texts)
    ratios = nll[picks].sum(1) / other[picks].sum(1)
    return float(nll.sum() / other.sum()), *map(float, np.percentile(ratios, [2.5, 97.5]))


def run_points(path: str) -> tuple[list[int], list[dict]]:
    """The scored bytes of each text of one run's split, and its points (each text's NLL in ``per_example``)."""
    run = json.load(open(path))
    cfg, results = OmegaConf.create(run["config"]), run["results"]
    text_bytes = scored_bytes(cfg, results["split"])
    if any(len(p["per_example"]["nll"]) != len(text_bytes) for p in results["points"]):
        raise SystemExit(f"{path}: the run's points score another number of texts than its data rebuilds ({len(text_bytes)})")
    return text_bytes, results["points"]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results.json files of LM prune runs (experiment=prune, data=lm_*) on the same texts")
    args = parser.parse_args(argv)
    if len(set(args.results)) < len(args.results):
        raise SystemExit(f"a results file is given twice: {' '.join(args.results)}")
    runs = {path: run_points(path) for path in args.results}
    text_bytes = runs[args.results[0]][0]
    for path, (other_bytes, _) in runs.items():
        if other_bytes != text_bytes:
            raise SystemExit(f"{path} scores other bytes than {args.results[0]}: per-byte pairs need the same texts and data settings")
    several = len(runs) > 1
    named = [(f"{Path(path).stem}:" * several + f"{point_name(p)}@{p['step']}", p) for path, (_, points) in runs.items() for p in points]
    for (name_a, a), (name_b, b) in itertools.combinations(named, 2):
        nll_a, nll_b = np.asarray(a["per_example"]["nll"]), np.asarray(b["per_example"]["nll"])
        per_byte = bootstrap_perplexity_ratio(list(-nll_b), list(-nll_a), text_bytes)
        bits, low, high = bits_ratio(nll_b, nll_a)
        print(
            f"{name_b} vs {name_a}: perplexity per byte x{per_byte['ratio']:.4f} [{per_byte['low']:.4f}, {per_byte['high']:.4f}],"
            f" bits per byte x{bits:.4f} [{low:.4f}, {high:.4f}]" + per_token_text(a, b)
        )


def per_token_text(a: dict, b: dict) -> str:
    """The per-token perplexity ratio of ``b`` over ``a`` as ", perplexity x<ratio> [low, high]" where both scored the same tokens, else ""."""
    ratio = point_perplexity_ratio(b, a)
    return "" if ratio is None else f", perplexity x{ratio['ratio']:.4f} [{ratio['low']:.4f}, {ratio['high']:.4f}]"


if __name__ == "__main__":
    main()
