"""How a quantised export's score moves with batching: one score per batch size, and their spread."""


def batch_spread(scores: dict[int, float]) -> dict:
    """{"batch_sizes", "scores" (one per size, in that order), "min", "max", "spread" (max - min)} of {batch size: score}."""
    sizes = sorted(scores)
    values = [float(scores[b]) for b in sizes]
    return {"batch_sizes": sizes, "scores": values, "min": min(values), "max": max(values), "spread": max(values) - min(values)}


def spread_line(name: str, record: dict) -> str:
    """``name`` at each batch size and the spread, for the printed summary."""
    each = ", ".join(f"{b}: {s:.4g}" for b, s in zip(record["batch_sizes"], record["scores"]))
    return f"{name} at batch {each} (min {record['min']:.4g}, max {record['max']:.4g}, spread {record['spread']:.3g})"
