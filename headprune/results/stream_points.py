"""What a streaming run records beside its scores: the action, sink and window, and each point's KV cache at the context."""

import torch

from headprune.core.stream_cache import stream_cache_bytes
from headprune.core.unit_kinds import noun, shrunk_fields
from headprune.results.points import percent

REMOVE = "remove"


def gate_action(gates) -> str:
    """What a gate at 0 does to a unit of ``gates``: ``stream`` (StreamGates) or ``remove`` (every other gates)."""
    return getattr(gates, "action", REMOVE)


def streaming(task) -> bool:
    return gate_action(task.gates) != REMOVE


def whole_groups(gates, mask) -> dict[str, torch.Tensor]:
    """A hard mask in the gates' unit whose query heads stream only where their whole KV group does (the cache's view)."""
    mask = gates.normalize_mask(mask, hard=True)
    if "num_attention_heads" not in shrunk_fields(gates.unit):
        return mask  # KV groups already: the cache's own units
    out = {}
    for group, alphas in mask.items():
        n = gates.heads_per_kv[group]
        kept = alphas.unflatten(-1, (alphas.shape[-1] // n, n)).amax(-1)  # (L, KV): 0 only when every query head streams
        out[group] = kept.repeat_interleave(n, dim=-1)
    return out


def kv_bytes(task, mask) -> int | None:
    """The KV cache of one sequence at the task's context under a hard streaming ``mask`` (None: the context is unknown)."""
    tokens = task.context_tokens
    return None if tokens is None else int(stream_cache_bytes(task.gates, whole_groups(task.gates, mask), int(tokens)))


def action_record(task) -> dict:
    """``{"action": "remove"}``, or for a streaming task the action, sink, window, context and the full cache there."""
    if not streaming(task):
        return {"action": REMOVE}
    gates = task.gates
    return {
        "action": gate_action(gates),
        "stream": {
            "sink": int(gates.sink),
            "window": int(gates.window),
            "context_tokens": task.context_tokens,
            "kv_bytes_full": kv_bytes(task, gates.ones()),
        },
    }


def point_cost(task, mask) -> dict:
    """A point's cost beside its score: for a streaming task its KV bytes at the context and their share of the full cache."""
    if not streaming(task):
        return {}
    held, full = kv_bytes(task, mask), kv_bytes(task, task.gates.ones())
    return {"kv_bytes": held, "kv_fraction": held / full if held is not None and full else None}


def examples_record(task, result, key: str = "per_example") -> dict:
    """A streaming point's per-example values (floats to 6 digits) for the paired tests of its orders; {} for a removing task."""
    if not streaming(task):
        return {}
    return {key: {name: [round(v, 6) if isinstance(v, float) else v for v in values] for name, values in result.per_example.items()}}


def streamed_label(mask: dict, unit) -> str:
    """What a streaming mask streams: ``KV groups streamed 30%`` (a JSON mask or tensors)."""
    values = [v for rows in mask.values() for v in (rows.flatten().tolist() if hasattr(rows, "flatten") else sum(rows, []))]
    share = sum(1 for v in values if v == 0) / len(values) if values else 0.0
    return f"{noun(unit, plural=True)} streamed {percent(share)}"


def action_words(task) -> tuple[str, str]:
    """(verb, participle) for titles and lines: ("pruning", "pruned") or ("streaming", "streamed")."""
    return ("streaming", "streamed") if streaming(task) else ("pruning", "pruned")


def say_cache(result: dict) -> None:
    """One line per order of a streaming prune result: the KV cache each step holds at the context, as a share of the full one."""
    stream = result.get("stream")
    if not stream or stream.get("kv_bytes_full") is None:
        return
    print(f"KV cache of one sequence at {stream['context_tokens']} tokens: {stream['kv_bytes_full']:,} bytes unstreamed")
    for order, v in result["orders"].items():
        shares = " ".join(
            f"{percent(s['fraction_removed'])}={100 * s['kv_fraction']:.0f}%" for s in v["steps"] if s.get("kv_fraction") is not None
        )
        print(f"{order}: KV cache held, share of the full one: {shares}")


def keep_one_title(task) -> str:
    """What the keep-one stage does, for figure titles: keep only the best unit of a layer, or stream all of it but the best."""
    if streaming(task):
        return f"Stream every {noun(task.gates.unit)} of a layer but its best"
    return "Keep only the best head per layer"
