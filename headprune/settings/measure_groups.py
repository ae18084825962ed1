"""The speed and export groups (conf/speed/default.yaml, conf/export/default.yaml): timing and shipping a pruned model."""

from dataclasses import dataclass

from headprune.core.checks import boolean, choice, integer, positive_ints, rule
from headprune.export import FORMATS
from headprune.settings.declare import COUNT, FRACTION, MAYBE_NAME, NAME, POSITIVE, setting

SPEED = ("speed",)
TIMING = ("speed", "prune")  # prune.measure_speed=true times its points with these
EXPORT = ("export",)


def mask_source(read_by: tuple[str, ...]) -> type:
    """The settings that say which mask a run takes: a prune run's results file and a point, step or fraction of it (or an order's)."""

    @dataclass(frozen=True)
    class MaskSourceSettings:
        mask_file: str | None = setting(MAYBE_NAME, read_by)
        mask_order: str = setting(NAME, read_by)
        mask_step: str | None = setting(MAYBE_NAME, read_by)
        fraction: float = setting(FRACTION, read_by)
        point: str | None = setting(MAYBE_NAME, read_by)

    return MaskSourceSettings


@dataclass(frozen=True)
class SpeedSettings(mask_source(SPEED)):
    """speed: physical pruning and throughput (conf/speed/default.yaml)."""

    batch_sizes: list = setting(rule(positive_ints), (*TIMING, "export"))  # export: int8 is scored at each
    examples: int = setting(COUNT, TIMING)
    warmup: int = setting(rule(integer, low=0), TIMING)
    repeats: int = setting(COUNT, TIMING)
    max_repeats: int = setting(rule(integer, low=2), TIMING)
    max_seconds: float = setting(POSITIVE, TIMING)
    tolerance: float = setting(POSITIVE, TIMING)
    split: str = setting(NAME, TIMING)
    check_score: bool = setting(rule(boolean), SPEED)
    clock: str = setting(rule(choice, choices=("wall", "process")), TIMING)
    runtime: str = setting(rule(choice, choices=("torch", "onnxruntime")), SPEED)  # the Pareto points are timed in torch only


@dataclass(frozen=True)
class ExportSettings(mask_source(EXPORT)):
    """export: a pruned model out of headprune (conf/export/default.yaml)."""

    format: str = setting(rule(choice, choices=FORMATS), EXPORT)
    model: str | None = setting(MAYBE_NAME, EXPORT)
    quantize: str = setting(rule(choice, choices=("none", "int8")), EXPORT)
    per_channel: bool = setting(rule(boolean), EXPORT)
    int8_batch_sizes: list[int] = setting(rule(positive_ints), EXPORT)
    gguf_dtype: str = setting(rule(choice, choices=("f32", "f16")), EXPORT)
    tokenizer_pre: str | None = setting(MAYBE_NAME, EXPORT)
    split: str = setting(NAME, EXPORT)
    examples: int = setting(COUNT, EXPORT)
    batch_size: int = setting(COUNT, EXPORT)
    new_tokens: int = setting(COUNT, EXPORT)
    tolerance: float = setting(POSITIVE, EXPORT)
    client_check: bool = setting(rule(boolean), EXPORT)
