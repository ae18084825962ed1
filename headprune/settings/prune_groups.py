"""The prune group (conf/prune/default.yaml): greedy pruning and pruning for speed, with its recoveries."""

from dataclasses import dataclass
from typing import Any

from headprune.core.checks import (
    boolean,
    boolean_or,
    choice,
    choices,
    fractions,
    integer,
    number,
    optional,
    pruning_unit,
    recovery_chains,
    rule,
)
from headprune.lightning.precisions import PRECISIONS
from headprune.scoring.order_names import ORDER_NAMES
from headprune.scoring.token_weights import TOKEN_WEIGHTS
from headprune.selection.joint_scale import JOINT_SCALES
from headprune.selection.uniform import LAYOUTS
from headprune.settings.declare import COUNT, FRACTION, MAYBE_NAME, NAME, NAMES, POSITIVE, section, setting

RECOVERIES = ("none", "lsq", "reconstruct", "finetune")
ACTIONS = ("remove", "stream")  # what a unit's gate at 0 does: the unit goes, or it attends to a sink and a recent window only

PRUNE = ("prune",)
MASK_BY_ORDER = ("prune", "speed")  # speed's mask without a mask file: the lowest speed.fraction by an order
GATED = ("ablate", "keep_one", "prune")  # the experiments that gate units without removing them from the weights


@dataclass(frozen=True)
class LsqSettings:
    """prune.lsq: the least-squares recovery."""

    ridge: float = setting(POSITIVE, PRUNE)
    max_scale: float = setting(POSITIVE, PRUNE)


@dataclass(frozen=True)
class ReconstructSettings:
    """prune.reconstruct: the layer-wise reconstruction (re-solved projections)."""

    ridge: float = setting(POSITIVE, PRUNE)
    target: str = setting(rule(choice, choices=("auto", "inputs", "teacher")), PRUNE)
    tokens: str = setting(rule(choice, choices=TOKEN_WEIGHTS), PRUNE)


@dataclass(frozen=True)
class FinetuneSettings:
    """prune.finetune: the fine-tune recovery."""

    max_steps: int = setting(COUNT, PRUNE)
    lr: float = setting(POSITIVE, PRUNE)
    distill_weight: float = setting(rule(number, low=0.0, high=1.0, closed="[]"), PRUNE)
    temperature: float = setting(POSITIVE, PRUNE)
    layer_distill: float = setting(rule(number, low=0.0), PRUNE)
    layer_loss: str = setting(rule(choice, choices=("batch", "token")), PRUNE)
    examples: int | None = setting(optional(COUNT), PRUNE)
    tokens: int | None = setting(optional(COUNT), PRUNE)
    seed: int = setting(rule(integer), PRUNE)
    warmup: float = setting(FRACTION, PRUNE)
    decay: bool = setting(rule(boolean), PRUNE)
    lora_rank: int | None = setting(optional(COUNT), PRUNE)
    lora_alpha: float | None = setting(optional(POSITIVE), PRUNE)
    progress: bool = setting(rule(boolean), PRUNE)
    teacher: str = setting(rule(choice, choices=("unpruned", "control")), PRUNE)
    precision: str = setting(rule(choice, choices=PRECISIONS), PRUNE)
    checkpoint_every: int | None = setting(optional(COUNT), PRUNE)


@dataclass(frozen=True)
class StreamSettings:
    """prune.stream: what a streamed unit still sees (prune.action=stream)."""

    sink: int = setting(rule(integer, low=0), GATED)
    window: int = setting(COUNT, GATED)


@dataclass(frozen=True)
class DuoSettings:
    """prune.duo: DuoAttention's optimised streaming gates (prune.order=duo)."""

    steps: int = setting(COUNT, PRUNE)
    lr: float = setting(POSITIVE, PRUNE)
    l1: float = setting(rule(number, low=0.0), PRUNE)


@dataclass(frozen=True)
class PruneSettings:
    """prune: greedy pruning and pruning for speed (conf/prune/default.yaml)."""

    unit: Any = setting(rule(pruning_unit), ("ablate", "keep_one", "prune", "speed", "export"))
    action: str = setting(rule(choice, choices=ACTIONS), GATED)
    order: Any = setting(rule(choices, known=ORDER_NAMES), PRUNE)  # a name or a list of names
    layout: str = setting(rule(choice, choices=LAYOUTS), MASK_BY_ORDER)
    joint_scale: str = setting(rule(choice, choices=JOINT_SCALES), MASK_BY_ORDER)
    ffn_multiple: int = setting(COUNT, PRUNE)
    hidden_multiple: int | None = setting(optional(COUNT), PRUNE)
    reestimate: bool = setting(rule(boolean), PRUNE)
    step: float = setting(rule(number, low=0.0, high=1.0, closed="()"), PRUNE)
    max_fraction: float = setting(FRACTION, PRUNE)
    fractions: Any = setting(optional(rule(fractions)), PRUNE)  # null, a number or a list
    groups: list = setting(NAMES, PRUNE)
    min_units_per_layer: int = setting(rule(integer, low=0), PRUNE)
    split: str = setting(NAME, PRUNE)
    ablation_split: str = setting(NAME, MASK_BY_ORDER)
    n_samples: int = setting(COUNT, MASK_BY_ORDER)
    scores_from: str | None = setting(MAYBE_NAME, PRUNE)
    target: Any = setting(None, PRUNE, "{speedup | flops | bytes | max_drop: number}, at most one set")
    schedule: Any = setting(None, PRUNE, "null, or growing fractions or targets of one kind")
    cost: str = setting(rule(choice, choices=("flops", "latency", "bytes")), PRUNE)
    seq_len: int = setting(COUNT, PRUNE)
    latency_batch_size: int = setting(COUNT, PRUNE)
    recover: Any = setting(rule(recovery_chains, known=RECOVERIES), PRUNE)  # a name, a chain (a+b) or a list of them
    rearrange: Any = setting(rule(boolean_or, words=("both",)), PRUNE)
    recover_examples: int = setting(COUNT, PRUNE)
    control: bool = setting(rule(boolean), PRUNE)
    extra_splits: list = setting(NAMES, PRUNE)
    vocab_text: list = setting(NAMES, PRUNE)
    obs_bias: bool = setting(rule(boolean), PRUNE)
    obs_tokens: str = setting(rule(choice, choices=TOKEN_WEIGHTS), PRUNE)
    selection_split: str | None = setting(MAYBE_NAME, PRUNE)
    measure_speed: bool = setting(rule(boolean), PRUNE)
    save: Any = setting(None, PRUNE, "recovered, all, none or a list of point names")
    lsq: LsqSettings = section(LsqSettings)
    reconstruct: ReconstructSettings = section(ReconstructSettings)
    finetune: FinetuneSettings = section(FinetuneSettings)
    stream: StreamSettings = section(StreamSettings)
    duo: DuoSettings = section(DuoSettings)
