"""The checks of a speed measurement, shared by experiment=speed and the study's speed stage."""

from pathlib import Path

from headprune.checks.shared_checks import check_mask_units, check_order_data, check_splits, no_duplicates, refuse_given
from headprune.core.checks import ConfigError
from headprune.core.unit_kinds import noun
from headprune.sources.mask_source import chosen_mask, pick_keys, point_model_dir, point_source, with_file_unit
from headprune.sources.orders import ORDERS, action_refusal
from headprune.tasks.unit_task import unit_of


def check_speed(speed) -> None:
    """speed.* timing: at least as many repeats allowed as asked for, batch sizes listed once."""
    no_duplicates(speed.batch_sizes, "speed.batch_sizes")
    if speed.repeats > speed.max_repeats:
        raise ConfigError(
            f"speed.repeats={speed.repeats} timed passes at least, but speed.max_repeats={speed.max_repeats} at most: "
            f"raise speed.max_repeats to {speed.repeats} or more, or lower speed.repeats"
        )


def check_removes_some(removed: int, total: int, where: str, unit) -> None:
    """Timing a mask (``where`` it came from, in words) that removes no unit, or every unit, compares nothing: a ConfigError."""
    one, many = noun(unit), noun(unit, plural=True)
    if removed == 0:
        raise ConfigError(f"{where} removes no {one}: the two timed models would be the same; prune some {many}")
    if removed == total:
        raise ConfigError(f"{where} removes every {one} ({total}): nothing would be left to time; keep some {many}")


def check_speed_run(cfg) -> None:
    """experiment=speed (and the study's speed stage): timing, the mask settings, the split and the chosen mask or point."""
    speed = cfg.speed
    check_speed(speed)
    check_splits(cfg, [speed.split], "speed.split")
    if speed.get("point"):
        # a point of speed.mask_file's prune run, picked by name alone, that removed some units (not the control)
        refuse_given(cfg, pick_keys("speed"), f"speed.point={speed.point} names the point itself")
        if not speed.get("mask_file"):
            raise ConfigError(f"speed.point={speed.point} names a point of a prune run: give speed.mask_file=<prune run>/results.json")
        point = point_source(speed, "speed")[1].point  # the file read and checked first
        if point.get("control"):
            raise ConfigError(
                f"speed.point={speed.point} is the control, the unpruned model fine-tuned: it has the unpruned model's shape, so "
                "timing it against the unpruned model compares nothing; name a pruned point"
            )
        point_model_dir(speed, "speed")  # a recovered point's model directory must be there
        return
    if speed.get("mask_file"):
        path = Path(str(speed.mask_file))  # the chosen mask: present, fitting the model, removing some units but not all
        mask = chosen_mask(speed, "speed")[1].mask
        unit = unit_of(with_file_unit(cfg, "speed"))
        check_mask_units(cfg, unit, mask)
        entries = [value for rows in mask.values() for row in rows for value in row]
        check_removes_some(entries.count(0), len(entries), f"speed.mask_file={path}: the chosen mask", unit)
        return
    if speed.get("mask_step") is not None:
        raise ConfigError(
            f"speed.mask_step={speed.mask_step} picks a Pareto point of speed.mask_file, which is not set: "
            "add speed.mask_file=<prune run>/results.json or drop speed.mask_step"
        )
    if speed.mask_order not in ORDERS:
        raise ConfigError(
            f"speed.mask_order={speed.mask_order}: without speed.mask_file the mask is the lowest speed.fraction of the "
            f"{noun(unit_of(cfg), plural=True)} "
            f"by an order of {list(ORDERS)}; a Pareto point's method (e.g. fisher+lsq) needs speed.mask_file"
        )
    refused = action_refusal(str(speed.mask_order), "remove")
    if refused:
        raise ConfigError(f"speed.mask_order={speed.mask_order}: {refused}")
    check_order_data(cfg, str(speed.mask_order))
    if speed.fraction == 0:
        raise ConfigError(
            f"speed.fraction=0 prunes no {noun(unit_of(cfg))}: the two timed models would be the same; give a fraction in (0, 1), e.g. 0.5"
        )
