"""The schema of the experiment settings: each setting's type, range or choices (its value lives in the YAML groups).

``SCHEMA`` maps a dotted setting to a rule of ``headprune.core.checks``; ``headprune.validation`` applies it
to every setting a composed config holds, before any work. Task settings (``task.*``, ``data.*``) are
checked by each task's own ``config_check.py``; settings that depend on each other by ``headprune.validation``.
"""

from __future__ import annotations

from headprune.core.checks import (
    boolean,
    boolean_or,
    choice,
    choices,
    fractions,
    integer,
    number,
    optional,
    positive_ints,
    rule,
    string_list,
    text,
)
from headprune.core.units import UNITS
from headprune.lightning.loggers import LOGGER_KINDS
from headprune.pipeline.orders import ORDERS
from headprune.scoring.importance import REDUCTIONS
from headprune.selection.uniform import LAYOUTS

RECOVERIES = ("none", "lsq", "finetune")
COSTS = ("flops", "latency")
CLOCKS = ("wall", "process")
RUNTIMES = ("torch", "onnxruntime")

PROBABILITY = rule(number, low=0.0, high=1.0, closed="()")
POSITIVE = rule(number, low=0.0, closed="()")
COUNT = rule(integer, low=1)
NAMES = rule(string_list)

BOOTSTRAP = {"n_samples": COUNT, "alpha": PROBABILITY}

PRUNE = {
    "unit": rule(choice, choices=UNITS),
    "order": rule(choices, known=ORDERS),
    "layout": rule(choice, choices=LAYOUTS),
    "reestimate": rule(boolean),
    "step": rule(number, low=0.0, high=1.0, closed="()"),
    "max_fraction": rule(number, low=0.0, high=1.0),
    "fractions": optional(rule(fractions)),
    "groups": NAMES,
    "min_heads_per_layer": rule(integer, low=0),
    "split": rule(text),
    "ablation_split": rule(text),
    "n_samples": COUNT,
    "cost": rule(choice, choices=COSTS),
    "seq_len": COUNT,
    "latency_batch_size": COUNT,
    "recover": rule(choices, known=RECOVERIES),
    "rearrange": rule(boolean_or, words=("both",)),
    "recover_examples": COUNT,
    "lsq.ridge": POSITIVE,
    "lsq.max_scale": POSITIVE,
    "finetune.max_steps": COUNT,
    "finetune.lr": POSITIVE,
    "finetune.distill_weight": rule(number, low=0.0, high=1.0, closed="[]"),
    "finetune.temperature": POSITIVE,
    "finetune.examples": optional(COUNT),
    "finetune.seed": rule(integer),
    "finetune.warmup": rule(number, low=0.0, high=1.0),
    "finetune.decay": rule(boolean),
    "finetune.tokens": optional(COUNT),
    "finetune.lora_rank": optional(COUNT),
    "finetune.lora_alpha": optional(POSITIVE),
    "finetune.progress": rule(boolean),
    "control": rule(boolean),
    "extra_splits": NAMES,
    "selection_split": optional(rule(text)),
    "measure_speed": rule(boolean),
}

SPEED = {
    "fraction": rule(number, low=0.0, high=1.0),
    "mask_file": optional(rule(text)),
    "mask_order": rule(text),
    "mask_step": optional(rule(text)),
    "point": optional(rule(text)),
    "batch_sizes": rule(positive_ints),
    "examples": COUNT,
    "warmup": rule(integer, low=0),
    "repeats": COUNT,
    "max_repeats": rule(integer, low=2),
    "max_seconds": POSITIVE,
    "tolerance": POSITIVE,
    "split": rule(text),
    "check_score": rule(boolean),
    "clock": rule(choice, choices=CLOCKS),
    "runtime": rule(choice, choices=RUNTIMES),
}

IMPORTANCE = {"reduce": rule(choice, choices=REDUCTIONS), "normalize_layers": rule(boolean), "normalize_global": rule(boolean)}

STUDY = {
    "train": rule(boolean),
    "fallback_data": rule(text),
    "split": rule(text),
    "selection_split": optional(rule(text)),
    "extra_splits": NAMES,
    "reestimate": rule(boolean),
    **BOOTSTRAP,
}

DYNAMICS = {
    "fractions": rule(fractions),
    "split": rule(text),
    "reduce": rule(choice, choices=REDUCTIONS),
    "tolerance": rule(number, low=0.0),
    "report_fraction": rule(number, low=0.0, high=1.0),
}

TRAINER = {
    "max_steps": rule(integer, low=-1),
    "log_every_n_steps": COUNT,
    "accumulate_grad_batches": COUNT,
    "num_sanity_val_steps": rule(integer, low=-1),
    "check_val_every_n_epoch": optional(COUNT),
    "gradient_clip_val": optional(rule(number, low=0.0)),
    "enable_progress_bar": rule(boolean),
    "enable_model_summary": rule(boolean),
    "deterministic": rule(boolean_or, words=("warn",)),
}


def _section(name: str, rules: dict) -> dict:
    return {f"{name}.{key}": check for key, check in rules.items()}


SCHEMA = {
    "seed": rule(integer),
    "device": rule(text),
    "logger.kind": rule(choice, choices=LOGGER_KINDS),
    "inspect.seq_len": COUNT,
    "callbacks.checkpoint.save_top_k": rule(integer, low=-1),
    "callbacks.checkpoint.every_n_epochs": optional(COUNT),
    "callbacks.checkpoint.every_n_train_steps": optional(COUNT),
    **_section("prune", PRUNE),
    **_section("speed", SPEED),
    **_section("importance", IMPORTANCE),
    **_section("study", STUDY),
    **_section("ablate", {"splits": NAMES, "groups": NAMES, **BOOTSTRAP}),
    **_section("keep_one", {"split": rule(text), "selection_split": optional(rule(text)), "groups": NAMES, **BOOTSTRAP}),
    **_section("dynamics", DYNAMICS),
    **_section("trainer", TRAINER),
}
