"""Checks of prune.action and prune.stream.*: what streaming needs of the model, the unit, the data and the other settings."""

from headprune.core.checks import ConfigError
from headprune.core.families import config_groups
from headprune.core.stream_gates import MASKED_ATTENTION, STREAM_UNITS, STREAMED_GROUP
from headprune.models.sources import config_fields, max_positions
from headprune.tasks.stream_task import task_context


def check_stream(cfg, prune) -> None:
    """prune.action=stream: a decoder LLM, an attention unit, a window within its positions and the context, no pruning for speed."""
    model = cfg.model.get("name")  # a decoder-only LLM whose attention takes the streaming mask
    fields = config_fields(cfg.model)
    groups = config_groups(fields) if fields is not None else None
    if groups is not None and STREAMED_GROUP not in groups:
        raise ConfigError(
            f"prune.action=stream on model={model}, an encoder (attention groups {groups}): it attends to every token at once "
            "and keeps no KV cache, so no head of it can be streamed: use a decoder-only LLM (e.g. model=tiny_llama, model=smollm2)"
        )
    if groups is not None and groups != [STREAMED_GROUP]:
        raise ConfigError(
            f"prune.action=stream on model={model}, an encoder-decoder (attention groups {groups}): streaming covers the "
            f"causal self-attention of decoder-only LLMs (e.g. model=tiny_llama, model=smollm2); use prune.action=remove here"
        )
    implementation = cfg.model.get("attn_implementation")
    if implementation is not None and str(implementation) not in MASKED_ATTENTION:
        raise ConfigError(
            f"prune.action=stream adds a sink + window mask to the attention, which model.attn_implementation={implementation} "
            f"does not take as a 4-D mask: set model.attn_implementation to one of {list(MASKED_ATTENTION)}"
        )
    unit = prune.unit
    if unit.name not in STREAM_UNITS:
        raise ConfigError(
            f"prune.unit={unit} with prune.action=stream: streaming limits how far back a unit of attention looks, and "
            f"{unit} holds units that attend to nothing (FFN neurons, whole blocks): use prune.unit=kv_group (or head)"
        )
    sink, window = int(cfg.prune.stream.sink), int(cfg.prune.stream.window)  # within the positions and below the longest context
    positions = max_positions(cfg.model)
    if positions is not None and window > positions:
        raise ConfigError(
            f"prune.stream.window={window} is larger than model {model}'s {positions} positions: no sequence it reads is that "
            f"long, so a streamed unit would see everything; choose a window below {positions}"
        )
    context = task_context(cfg.data)
    if context is not None and sink + window >= context:
        raise ConfigError(
            f"prune.stream.sink={sink} + prune.stream.window={window} = {sink + window} tokens reach the whole context of "
            f"data={cfg.data.get('name')} ({context} tokens at most): a streamed unit would keep every key and nothing would be "
            f"saved; choose sink + window below {context} (e.g. prune.stream.window={max(1, context // 2 - sink)})"
        )
    if str(prune.given.cost) == "bytes":
        raise ConfigError(
            "prune.cost=bytes counts the weights a decoded token reads, and prune.action=stream keeps every weight: a streamed "
            "unit's saving is the KV cache every point reports (kv_bytes at the task's context); drop prune.cost=bytes"
        )
    if prune.for_speed:  # pruning for speed removes units from the weights; a streamed unit keeps its weights
        raise ConfigError(
            "prune.action=stream gates units, and pruning for speed (prune.target / schedule / recover / rearrange / "
            "measure_speed) removes them from the weights: a streamed unit keeps its weights, its saving is the KV cache "
            "every point reports (kv_bytes at the task's context); give prune.fractions instead"
        )
