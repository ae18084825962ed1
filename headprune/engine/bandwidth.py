"""The bandwidth-ideal of a decode gain in PyTorch: the bytes one generated token reads, original over pruned."""

from torch import nn

from headprune.core.counting import kv_cache_bytes_per_token


def weight_bytes_per_token(model: nn.Module) -> int:
    """Bytes of weights one decoded token reads: every parameter once, an untied input embedding one row."""
    total = sum(p.numel() * p.element_size() for p in model.parameters())  # shared (tied) parameters counted once
    embedding = model.get_input_embeddings().weight if hasattr(model, "get_input_embeddings") else None
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if embedding is not None and (output is None or output.weight is not embedding):
        total -= (embedding.shape[0] - 1) * embedding.shape[1] * embedding.element_size()
    return total


def decode_bandwidth_ideal(original: nn.Module, pruned: nn.Module, start: int, end: int) -> float:
    """(weights + KV cache at the mean context) read per token, original over pruned, - 1, for new tokens ``start`` .. ``end`` - 1."""
    context = (start + end + 1) / 2
    reads = [weight_bytes_per_token(m) + kv_cache_bytes_per_token(m) * context for m in (original, pruned)]
    return reads[0] / reads[1] - 1
