"""experiment=inspect: print a model's attention groups, heads, parameters and attention FLOPs."""

from dataclasses import asdict
from pathlib import Path

from hydra.utils import get_method
from omegaconf import OmegaConf

from headprune.checks.shared_checks import check_device, check_model, refuse_given
from headprune.core.counting import model_cost
from headprune.core.units import model_gates
from headprune.results.writer import model_fingerprint, write_results_file
from headprune.tasks.registry import build_task_model, model_task


def run(cfg) -> dict:
    """Build the configured model, attach gates and report its structure and cost."""
    model = build_task_model(cfg.model, seed=int(cfg.seed))
    own = model_task(cfg.model).own_length  # the tokens per example where the task fixes them (image patches + CLS)
    seq_len, how = get_method(own)(model) if own is not None else (int(cfg.inspect.seq_len), "inspect.seq_len")
    tokens = f"seq_len={seq_len} ({how})"
    gates = model_gates(model)
    cost = model_cost(model, seq_len=seq_len)
    print(
        f"model: {cfg.model.name} ({type(model).__name__}, model_type={model.config.model_type}, "
        f"attention={gates.inner} under headprune gates)"
    )
    grouped_kv = gates.kv_groups != gates.groups  # grouped-query attention: fewer KV heads than query heads
    print(f"{'group':9s} {'layers':>6s} {'heads/layer':>11s} {'heads':>6s}" + (f" {'kv_heads/layer':>14s}" if grouped_kv else ""))
    for group, (layers, heads) in gates.groups.items():
        print(f"{group:9s} {layers:6d} {heads:11d} {layers * heads:6d}" + (f" {gates.kv_groups[group][1]:14d}" if grouped_kv else ""))
    print(f"heads present: {cost.heads} of {gates.num_heads}")
    print(f"parameters: {cost.parameters:,} (attention projections: {cost.attention_parameters:,})")
    print(
        f"forward FLOPs per example at {tokens}: {cost.flops:,} "
        f"(attention: {cost.attention_flops:,}, {100 * cost.attention_flops / cost.flops:.1f}%)"
    )
    numbers = {"groups": {g: list(s) for g, s in gates.groups.items()}, "cost": asdict(cost), "tokens": tokens}
    if grouped_kv:
        numbers["kv_groups"] = {g: list(s) for g, s in gates.kv_groups.items()}
    write_results_file(
        Path(cfg.paths.output_dir) / "results.json",
        "inspect",
        OmegaConf.to_container(cfg, resolve=False),
        numbers,
        {"model": model_fingerprint(model)},
    )
    return numbers


def check(cfg) -> None:
    """experiment=inspect: the device and the model (no task, no data); inspect.seq_len only where the model has no length of its own."""
    check_device(cfg)
    check_model(cfg)
    if model_task(cfg.model).own_length is not None:
        refuse_given(cfg, ("inspect.seq_len",), "this model is counted at its own tokens per example (an image's patches + CLS)")
