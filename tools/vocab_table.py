"""The vocabulary cuts of one prune run (``prune.unit=vocab``), each scored through its own rewritten tokenizer, as a table."""

from __future__ import annotations

from units_table import _accuracy


def vocab_cut_table(run: dict) -> str:
    """Tokens kept, tokens the rewritten tokenizer can produce, bits per byte against the unpruned model, per-token perplexity."""
    results = run["results"]
    total = results["units_total"]
    rows = [
        "| vocabulary | tokens the tokenizer produces | eval tokens predicted | bits per byte | vs unpruned | per-token perplexity |",
        "|---|---:|---:|---:|---:|---:|",
        f"| unpruned | {total:,} | | {results['base_bits_per_byte']:.4f} | | {results['base_score']:.2f} |",
    ]
    for order, curve in results["orders"].items():
        for step in curve["steps"]:
            tokenizer = step["tokenizer"]
            rows.append(
                f"| {order}: {tokenizer['size']:,} kept | {tokenizer['produced']:,} | {tokenizer['data']['predicted_tokens']:,} | "
                f"{step['bits_per_byte']:.4f} | {100 * (step['relative'] - 1):+.1f}% | {step['score']:.2f} |"
            )
    split, n = results["split"], results["n_examples"]
    return (
        "\n".join(rows) + f"\n\nOn `{split}` ({n} texts), each cut's model reading its own rewritten tokenizer's split of the same text.\n"
    )


def classifier_vocab_cut_table(run: dict) -> str:
    """A classifier's vocabulary cuts (prune.unit=vocab, retraining-free): tokens kept, accuracy with its interval, difference."""
    results = run["results"]
    n, base = results["n_examples"], results["base_score"]
    rows = [
        "| vocabulary | tokens kept (the rewritten tokenizer produces) | accuracy [95%] | vs unpruned |",
        "|---|---:|---:|---:|",
        f"| unpruned | {results['units_total']:,} | {_accuracy(base, n)} | |",
    ]
    for order, curve in results["orders"].items():
        for step in curve["steps"]:
            tokenizer = step["tokenizer"]
            rows.append(
                f"| {order}, {100 * step['fraction']:.0f}% of the tokens removed | {tokenizer['size']:,} ({tokenizer['produced']:,}) | "
                f"{_accuracy(step['score'], n)} | {step['score'] - base:+.2f} |"
            )
    return "\n".join(rows) + f"\n\nOn `{results['split']}` ({n} examples), each cut's model reading its own rewritten tokenizer's split.\n"
