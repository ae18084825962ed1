"""What the Llama-layout writers (GGUF, vLLM's DeciLM) share in their refusals: the rotary embedding and the biases."""


def rope_and_bias_refusal(fields: dict, fmt: str, instead: str) -> str | None:
    """Why ``export.format=<fmt>`` cannot write a Llama model of these config fields, ending with ``use <instead>``; None when it can."""
    rope = fields.get("rope_parameters") or fields.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "linear"):
        return f"export.format={fmt} writes default or linear rotary embeddings only, this model has {rope}: use {instead}"
    if fields.get("attention_bias") or fields.get("mlp_bias"):
        return f"export.format={fmt} writes Llama models without attention or MLP biases: use {instead}"
    return None
