"""Checks of prune.action and prune.stream.*: what streaming needs of the model, the unit, the data and the other settings.

Streaming limits a unit to the first ``sink`` tokens and a recent ``window`` of its causal KV cache, so it needs a
decoder-only LLM whose attention takes a 4-D mask, a unit of attention (a head or a KV group), a window the model's
positions can hold and a context longer than sink + window (else a streamed unit keeps every key and nothing is saved).
"""

from __future__ import annotations

from headprune.core.checks import ConfigError
from headprune.core.stream_gates import MASKED_ATTENTION, STREAM_UNITS
from headprune.models.sources import max_positions
from headprune.tasks.stream_task import STREAM, action_of, task_context
from headprune.tasks.unit_task import unit_of

DECODER_ONLY = "causal_lm"  # the model.kind of decoder-only LLMs: the only models whose KV cache a streamed head shortens
ENCODERS = ("classifier", "image_classifier")


def check_action(cfg) -> None:
    """prune.action and prune.stream.*: stream.* only with action=stream; streaming on a decoder LLM, in an attention unit,
    with a window within the model's positions and sink + window below the task's context, and no pruning for speed."""
    from headprune.pipeline.shared_checks import refuse_given

    if action_of(cfg) != STREAM:
        refuse_given(
            cfg,
            ("prune.stream",),
            "prune.stream.* sets what a streamed unit still sees, and prune.action=remove removes units (add prune.action=stream)",
        )
        return
    check_stream_model(cfg)
    unit = unit_of(cfg)
    if unit not in STREAM_UNITS:
        raise ConfigError(
            f"prune.unit={unit} with prune.action=stream: streaming limits how far back a unit of attention looks, and "
            f"{unit} holds units that attend to nothing (FFN neurons, whole blocks): use prune.unit=kv_group (or head)"
        )
    check_span(cfg)
    check_not_for_speed(cfg.prune)


def check_stream_model(cfg) -> None:
    """A decoder-only LLM whose attention implementation takes the streaming mask."""
    model, kind = cfg.model.get("name"), str(cfg.model.get("kind"))
    if kind in ENCODERS:
        raise ConfigError(
            f"prune.action=stream on model={model}, an encoder (model.kind {kind}): it attends to every token at once and "
            "keeps no KV cache, so no head of it can be streamed: use a decoder-only LLM (e.g. model=tiny_llama, model=smollm2)"
        )
    if kind != DECODER_ONLY:
        raise ConfigError(
            f"prune.action=stream on model={model} (model.kind {kind}): streaming covers the self-attention of decoder-only "
            f"LLMs (model.kind {DECODER_ONLY}, e.g. model=tiny_llama, model=smollm2); use prune.action=remove here"
        )
    implementation = cfg.model.get("attn_implementation")
    if implementation is not None and str(implementation) not in MASKED_ATTENTION:
        raise ConfigError(
            f"prune.action=stream adds a sink + window mask to the attention, which model.attn_implementation={implementation} "
            f"does not take as a 4-D mask: set model.attn_implementation to one of {list(MASKED_ATTENTION)}"
        )


def check_span(cfg) -> None:
    """A window within the model's positions, and sink + window below the longest context of the task's data."""
    stream, name = cfg.prune.stream, cfg.model.get("name")
    sink, window = int(stream.sink), int(stream.window)
    positions = max_positions(cfg.model)
    if positions is not None and window > positions:
        raise ConfigError(
            f"prune.stream.window={window} is larger than model {name}'s {positions} positions: no sequence it reads is that "
            f"long, so a streamed unit would see everything; choose a window below {positions}"
        )
    context = task_context(cfg.data)
    if context is not None and sink + window >= context:
        raise ConfigError(
            f"prune.stream.sink={sink} + prune.stream.window={window} = {sink + window} tokens reach the whole context of "
            f"data={cfg.data.get('name')} ({context} tokens at most): a streamed unit would keep every key and nothing would be "
            f"saved; choose sink + window below {context} (e.g. prune.stream.window={max(1, context // 2 - sink)})"
        )


def check_not_for_speed(prune) -> None:
    """Pruning for speed removes units from the weights; a streamed unit keeps its weights."""
    from headprune.pipeline.pareto_plan import for_speed

    if for_speed(prune):
        raise ConfigError(
            "prune.action=stream gates units, and pruning for speed (prune.target / schedule / recover / rearrange / "
            "measure_speed) removes them from the weights: a streamed unit keeps its weights, its saving is the KV cache "
            "every point reports (kv_bytes at the task's context); give prune.fractions instead"
        )
