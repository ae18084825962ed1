"""One check of a composed experiment config before any work: settings, data files and the model directory.

``validate(cfg)`` is called by the ``headprune`` entry point for every experiment (each stage of a
study included). It reads no model weights and runs no forward pass. In turn: top-level keys that no
config group defines (a ConfigWarning), every setting's type, range and choices
(``headprune.experiments.schema.SCHEMA``), the device, the model directory (config, weights,
tokenizer), the task's own check (``TaskSpec.check``: its task.* and data.* settings, data files,
lengths the model can take), then the entry point's checks of settings that depend on each other or
would be ignored (``RUNS``). The first problem is raised as a ``ConfigError`` naming the setting.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError, check_schema, choice, integer, string_list, warn
from headprune.experiments.schema import SCHEMA
from headprune.experiments.study import study_training_config
from headprune.models.sources import config_fields as model_fields
from headprune.models.sources import heads_per_layer, kv_heads_per_layer
from headprune.results.readers import check_mask_file
from headprune.selection.mask_search import given_target

# ---- keys, device, model ------------------------------------------------------------------------


@lru_cache(maxsize=1)
def known_keys() -> frozenset[str]:
    """Every top-level key a config group can set: config.yaml's, the groups' names and the keys of ``@package _global_`` files."""
    from headprune.experiments.conf_dir import config_dir

    root = Path(config_dir())
    keys = set(OmegaConf.load(root / "config.yaml"))
    for path in root.rglob("*.yaml"):
        parts = path.relative_to(root).parts
        keys.add(parts[0].removesuffix(".yaml"))
        header = [line for line in path.read_text().splitlines() if line.startswith("#")][:3]
        if any("@package _global_" in line for line in header):
            keys.update(OmegaConf.load(path))
    return frozenset(keys - {"defaults"})


def warn_unknown_keys(cfg) -> None:
    """A ConfigWarning for top-level keys (``+foo=1``) that no config group defines: nothing reads them."""
    unknown = sorted(set(cfg) - known_keys())
    if unknown:
        warn(
            f"setting(s) {unknown} are defined by no config group, so no experiment reads them: check the spelling "
            "(e.g. prune.step, not +step); they are ignored"
        )


def check_device(cfg) -> None:
    """``device`` names a device this machine has (``auto``: CUDA when there is one)."""
    import torch

    name = str(cfg.get("device") or "auto")
    if name == "auto":
        return
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ConfigError(f"device={name} is no device: use auto, cpu, cuda or cuda:<index>") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device={name} asks for a CUDA GPU, but there is no GPU here: use device=auto or device=cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"device={name}: this machine has {torch.cuda.device_count()} CUDA GPU(s), numbered from 0")


def check_model(cfg) -> None:
    """model.kind, and a pretrained model that exists and is complete (config, weights, tokenizer)."""
    from headprune.tasks.registry import TASKS

    choice(cfg.model.get("kind"), "model.kind", TASKS)
    try:
        _check_model_files(cfg)
    except ModuleNotFoundError as err:  # an embedded model's package or its GGUF reader is not installed
        raise ConfigError(str(err)) from None


def _check_model_files(cfg) -> None:
    from headprune.models.build import tokenizer_source
    from headprune.models.sources import check_model_dir, resolve_pretrained

    model = cfg.model
    pretrained = model.get("pretrained")
    if pretrained and str(pretrained).endswith(".ckpt"):
        resolve_pretrained(str(pretrained))  # a training checkpoint: it must exist
    elif pretrained:
        source = resolve_pretrained(str(pretrained))
        own_tokenizer = not model.get("tokenizer") or str(model.get("tokenizer")) == str(pretrained)
        if ((cfg.get("data") or {}).get("tokenizer") or {}).get("path"):
            own_tokenizer = False  # data.tokenizer.path gives the tokenizer
        check_model_dir(source, tokenizer=own_tokenizer)
    elif model.get("config") is None:
        raise ConfigError(f"model {model.get('name')!r} sets neither model.pretrained nor model.config: set one of them")
    if model.get("tokenizer"):  # models built fresh without one train their own (MT, LM); the NLI task requires one
        tokenizer_source(model)


# ---- the task -----------------------------------------------------------------------------------


def task_spec_of(cfg):
    """The TaskSpec of model.kind, fitting the chosen data, or a ConfigError."""
    from headprune.tasks.registry import task_spec

    try:
        return task_spec(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_task(cfg, run: Run) -> None:
    """The task's own check (``TaskSpec.check``): its settings, data files (unless a study falls back) and lengths."""
    from hydra.utils import get_method

    spec = task_spec_of(cfg)
    local_missing = cfg.data.get("source") == "local" and not Path(str(cfg.data.get("dir"))).exists()
    get_method(spec.check)(cfg, files=not (run.falls_back and local_missing), importance=run.importance)


def splits_of(cfg) -> tuple[str, ...]:
    """The split names the config's task reads."""
    return task_spec_of(cfg).splits


def concrete_split(cfg, split: str) -> str:
    """The data split a split name reads (e.g. MT ``eval`` -> test, ``heldout`` -> valid), or a ConfigError."""
    from hydra.utils import get_method

    spec = task_spec_of(cfg)
    if split not in spec.splits:
        raise ConfigError(f"split must be one of {list(spec.splits)}, got {split!r}")
    return get_method(spec.data_split)(cfg.data, split) if spec.data_split else split


def check_splits(cfg, names, setting: str) -> None:
    for name in names:
        try:
            concrete_split(cfg, str(name))
        except ConfigError:
            raise ConfigError(f"{setting}: unknown split {name!r}; choose from {list(splits_of(cfg))}") from None


def check_selection(cfg, section: str) -> None:
    """The selection split (appendix A) must differ from the evaluation split."""
    settings = cfg[section]
    split = str(settings.get("split"))
    selection = settings.get("selection_split") or (cfg.get("task") or {}).get("selection_split") or task_spec_of(cfg).selection
    try:
        same = concrete_split(cfg, str(selection)) == concrete_split(cfg, split)
    except ConfigError as err:
        raise ConfigError(f"{section}: {err} (splits: {list(splits_of(cfg))})") from None
    if same:
        raise ConfigError(
            f"{section}.selection_split={selection} reads the same data as {section}.split={split}: "
            "choose the head on other data (null = the task's held-out data)"
        )


# ---- units --------------------------------------------------------------------------------------


def check_unit(cfg) -> None:
    """prune.unit: head, or kv_group on a model with grouped-query attention (fewer KV heads than query heads)."""
    fields = model_fields(cfg.model) if str(cfg.prune.unit) == "kv_group" else None
    if fields is not None and kv_heads_per_layer(fields) is None:
        raise ConfigError(
            f"prune.unit=kv_group needs grouped-query attention (fewer KV heads than query heads); model "
            f"{cfg.model.get('name')} has one KV head per query head: use prune.unit=head"
        )


def check_mask_units(cfg, mask: dict) -> None:
    """A mask of a model with one attention group has one row per layer and one entry per unit (query head or KV head)."""
    unit = str(cfg.prune.unit)
    fields = model_fields(cfg.model) or {}
    per_layer = kv_heads_per_layer(fields) if unit == "kv_group" else fields.get("num_attention_heads")
    layers = fields.get("num_hidden_layers")
    if not isinstance(per_layer, int) or not isinstance(layers, int) or len(mask) != 1:
        return  # encoder-decoder groups differ in size: the task checks them when it loads the mask
    what = "KV heads" if unit == "kv_group" else "heads"
    for group, rows in mask.items():
        for layer, row in enumerate(rows):
            if len(row) != per_layer or len(rows) != layers:
                raise ConfigError(
                    f"speed.mask_file={cfg.speed.mask_file}: group {group} layer {layer} has {len(row)} entries "
                    f"({len(rows)} layers); model {cfg.model.get('name')} has {layers} layers x {per_layer} {what} "
                    f"(prune.unit={unit}): KV head / head ids must be within 0..{per_layer - 1}"
                )


# ---- prune --------------------------------------------------------------------------------------


def check_prune(cfg) -> None:
    """prune.*: a per-layer floor below the layers' head count, known splits, re-estimation where it does something."""
    prune = cfg.prune
    heads = heads_per_layer(cfg.model, str(prune.unit))
    k = prune.min_heads_per_layer
    if heads is not None and k >= heads:
        raise ConfigError(
            f"prune.min_heads_per_layer={k} keeps every head: the model's layers have {heads} heads, "
            f"so it must be at most {heads - 1} (0 = no floor)"
        )
    check_splits(cfg, [prune.split, prune.ablation_split], "prune.split/ablation_split")
    check_reestimate(prune)


def check_reestimate(prune) -> None:
    """prune.reestimate recomputes the plain curves' re-estimable orders: with none of them, or for speed, it would be ignored."""
    from headprune.experiments.orders import ORDERS
    from headprune.experiments.prune_speed import for_speed

    if not prune.reestimate:
        return
    if for_speed(prune):
        raise ConfigError(
            "prune.reestimate=true re-estimates the plain pruning curves; with prune.target / schedule / recover / "
            "rearrange / measure_speed it would be ignored: drop it (prune.schedule re-scores after every step)"
        )
    orders = string_list(prune.order, "prune.order")
    if not any(ORDERS[order].reestimable for order in orders):
        raise ConfigError(
            f"prune.reestimate=true, but no order of prune.order={orders} can be re-estimated (random and ablation "
            f"cannot): add one of {[o for o, v in ORDERS.items() if v.reestimable]} or drop prune.reestimate"
        )


def target_of(value, name: str):
    """A validated ``PruneTarget`` from a one-key mapping, or a ConfigError naming the setting."""
    from headprune.selection.mask_search import PruneTarget

    try:
        return PruneTarget.from_config(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
    except ValueError as err:
        raise ConfigError(f"{name}: {err}") from None


def schedule_of(value) -> list:
    """The validated ``prune.schedule``: growing fractions, or targets of one kind that go further each step, or a ConfigError."""
    from headprune.selection.schedule import check_schedule

    steps = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    if not isinstance(steps, (list, tuple)):
        raise ConfigError(f"prune.schedule must be a list of growing fractions or targets, e.g. [0.2, 0.4], got {steps!r}")
    try:
        return check_schedule(steps)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"prune.schedule: {err}") from None


def prune_steps(prune) -> list:
    """The steps of prune.target or prune.schedule (targets or fractions; [] for neither), or a ConfigError."""
    target = given_target(prune.get("target"))
    if target is not None and prune.get("schedule") is not None:
        raise ConfigError("give prune.target or prune.schedule, not both (the schedule's last step is its target)")
    if prune.get("schedule") is not None:
        return schedule_of(prune.schedule)
    return [] if target is None else [target_of(target, "prune.target")]


def check_prune_for_speed(cfg) -> None:
    """prune.target / schedule / cost / recover / rearrange / finetune / measure_speed, and the selection split a max_drop reads."""
    prune = cfg.prune
    steps = prune_steps(prune)
    check_speed_unit(prune)
    targets = [s for s in steps if not isinstance(s, float)]
    check_cost(prune, targets)
    if any(t.kind == "max_drop" for t in targets):
        check_selection(cfg, "prune")
    check_finetune(cfg)
    check_control(cfg)
    from headprune.experiments.point_models import check_save
    from headprune.experiments.prune_speed import for_speed

    check_save(OmegaConf.to_container(prune.save) if OmegaConf.is_config(prune.save) else prune.save, for_speed(prune))
    if prune.measure_speed:
        if cfg.get("speed") is None:
            raise ConfigError("prune.measure_speed=true needs the speed.* settings (experiment=prune and study have them)")
        check_speed(cfg.speed)


def check_speed_unit(prune) -> None:
    """Latency tables are measured per query head; rearranging re-chooses one-shot masks only."""
    rearrange = prune.rearrange
    if str(prune.unit) != "head" and str(prune.cost) == "latency":
        raise ConfigError(
            "prune.cost=latency measures its tables per query head: use prune.cost=flops with prune.unit=kv_group (or prune.unit=head)"
        )
    if rearrange and prune.get("schedule") is not None:
        raise ConfigError(
            "prune.rearrange re-chooses the heads of one-shot masks (prune.fractions or prune.target), "
            "not with prune.schedule: drop one of them"
        )


def check_cost(prune, targets: list) -> None:
    """prune.cost: a flops target needs the FLOPs model; a latency table serves targets only."""
    if any(t.kind == "flops" for t in targets) and prune.cost != "flops":
        raise ConfigError("a flops target needs prune.cost=flops (a latency table predicts seconds, not FLOPs)")
    if prune.cost == "latency" and not targets:
        raise ConfigError(
            "prune.cost=latency chooses the heads that meet a target (prune.target or a schedule of targets); without one "
            "it would be ignored: add e.g. 'prune.target={speedup:1.3}' or drop prune.cost=latency"
        )


def check_finetune(cfg) -> None:
    """prune.finetune: a warm-up belongs to the decaying lr schedule; LoRA needs peft and a rank below every projection."""
    finetune = cfg.prune.finetune
    if finetune.warmup > 0 and not finetune.decay:
        raise ConfigError(
            f"prune.finetune.warmup={finetune.warmup} warms up the lr schedule of prune.finetune.decay=true only; with "
            "decay=false the lr is constant and the warm-up would be ignored: add prune.finetune.decay=true or drop the warm-up"
        )
    rank = finetune.get("lora_rank")
    if rank is None:
        return
    from importlib.util import find_spec

    if find_spec("peft") is None:
        raise ConfigError(
            "prune.finetune.lora_rank needs the peft package: pip install peft (headprune's llm extra), "
            "or prune.finetune.lora_rank=null for a full fine-tune"
        )
    smallest = smallest_projection(cfg.model)
    if smallest is not None and rank > smallest:
        raise ConfigError(
            f"prune.finetune.lora_rank={rank} is larger than the smallest projection LoRA adapts in model "
            f"{cfg.model.get('name')} ({smallest} features): a rank above it is no low-rank update; "
            f"choose at most {smallest} (e.g. 8 or 16), or null for a full fine-tune"
        )


def smallest_projection(model_cfg) -> int | None:
    """min(in, out) over the attention and MLP projections a model's config describes (None: unknown)."""
    fields = model_fields(model_cfg)
    if fields is None:
        return None
    width = fields.get("hidden_size") or fields.get("d_model")
    ffn = [fields.get(k) for k in ("intermediate_size", "encoder_ffn_dim", "decoder_ffn_dim")]
    heads = fields.get("num_attention_heads") or fields.get("encoder_attention_heads")
    head_dim = fields.get("head_dim") or (width // heads if isinstance(width, int) and isinstance(heads, int) and heads else None)
    kv = fields.get("num_key_value_heads") or heads
    sizes = [width, *ffn, head_dim * kv if isinstance(head_dim, int) and isinstance(kv, int) else None]
    sizes = [int(x) for x in sizes if isinstance(x, int) and not isinstance(x, bool)]
    return min(sizes) if sizes else None


def check_control(cfg) -> None:
    """prune.control needs a fine-tune to give the unpruned model; prune.extra_splits are other splits than prune.split."""
    prune = cfg.prune
    if prune.control and "finetune" not in string_list(prune.recover, "prune.recover"):
        raise ConfigError(
            "prune.control=true gives the unpruned model the same fine-tune as the pruned ones, but prune.recover "
            f"has no finetune ({prune.recover!r}): add prune.recover=finetune (or a list with it), or drop prune.control"
        )
    extra = string_list(prune.extra_splits, "prune.extra_splits")
    check_splits(cfg, extra, "prune.extra_splits")
    if str(prune.split) in extra:
        raise ConfigError(f"prune.extra_splits={extra} repeats prune.split={prune.split}: list other evaluation splits")


# ---- physical pruning --------------------------------------------------------------------------


def physical_pruning(cfg) -> str | None:
    """What in this run removes heads physically (None: it only masks them)."""
    from headprune.experiments.prune_speed import for_speed, recoveries_of

    run = str(cfg.get("run"))
    if run.endswith(("speed.run", "study.run")):
        return "its speed measurement times the physically pruned model"
    if run.endswith("export.run"):
        return "the export writes the model pruned by export.mask_file" if cfg.export.get("mask_file") else None
    prune = cfg.prune
    if not run.endswith("prune.run") or not for_speed(prune):
        return None
    recover = recoveries_of(prune)
    save = OmegaConf.to_container(prune.save) if OmegaConf.is_config(prune.save) else prune.save
    uses = {
        "prune.recover=finetune fine-tunes a pruned copy": "finetune" in recover,
        "prune.measure_speed=true times pruned copies": bool(prune.measure_speed),
        "prune.schedule removes heads at every step": prune.get("schedule") is not None,
        "prune.cost=latency times pruned copies": str(prune.cost) == "latency",
        f"prune.save={save} keeps pruned models": save != "none" and (save == "all" or not isinstance(save, str) or recover != ["none"]),
    }
    return next((what for what, used in uses.items() if used), None)


def check_exact_pruning(cfg) -> None:
    """A run that prunes physically is refused before work on a model whose pruning cannot be exact (OLMo 2, Falcon with ALiBi)."""
    from headprune.core.families import FAMILIES
    from headprune.core.pruning import inexact_reason

    fields = model_fields(cfg.model) or {}
    family = next((f for f in FAMILIES if fields.get("model_type") in f.model_types), None)
    reason = family and inexact_reason(family, fields)
    what = reason and physical_pruning(cfg)
    if what:
        raise ConfigError(
            f"model {cfg.model.get('name')}: {reason}; this run prunes physically: {what}. Gates, importance scores and "
            "ablation work on it: run experiment=ablate or keep_one, or experiment=prune with masks only (no "
            "prune.recover=finetune, measure_speed, schedule or cost=latency, and prune.save=none)"
        )


# ---- speed --------------------------------------------------------------------------------------


def check_speed(speed) -> None:
    """speed.* timing: at least as many repeats allowed as asked for."""
    if speed.repeats > speed.max_repeats:
        raise ConfigError(
            f"speed.repeats={speed.repeats} timed passes at least, but speed.max_repeats={speed.max_repeats} at most: "
            f"raise speed.max_repeats to {speed.repeats} or more, or lower speed.repeats"
        )


def check_speed_run(cfg) -> None:
    """experiment=speed (and the study's speed stage): timing, the mask settings, the split and the chosen mask."""
    speed = cfg.speed
    check_speed(speed)
    check_splits(cfg, [speed.split], "speed.split")
    if speed.get("mask_file"):
        check_mask_file(speed.mask_file)
        check_chosen_mask(cfg)
        return
    from headprune.experiments.orders import ORDERS

    if speed.get("mask_step") is not None:
        raise ConfigError(
            f"speed.mask_step={speed.mask_step} picks a Pareto point of speed.mask_file, which is not set: "
            "add speed.mask_file=<prune run>/results.json or drop speed.mask_step"
        )
    if speed.mask_order not in ORDERS:
        raise ConfigError(
            f"speed.mask_order={speed.mask_order}: without speed.mask_file the mask is the lowest speed.fraction of the heads "
            f"by an order of {list(ORDERS)}; a Pareto point's method (e.g. fisher+lsq) needs speed.mask_file"
        )
    if speed.fraction == 0:
        raise ConfigError("speed.fraction=0 prunes no head: the two timed models would be the same; give a fraction in (0, 1), e.g. 0.5")


def check_chosen_mask(cfg) -> None:
    """The mask speed.mask_file / mask_order / fraction / mask_step pick: present, fitting the model, removing some heads but not all."""
    from headprune.experiments.mask_source import chosen_mask, with_file_unit

    speed = cfg.speed
    path = Path(str(speed.mask_file))
    mask = chosen_mask(speed, "speed")[1].mask
    check_mask_units(with_file_unit(cfg, "speed"), mask)
    entries = [value for rows in mask.values() for row in rows for value in row]
    if 0 not in entries:
        raise ConfigError(f"speed.mask_file={path}: the chosen mask removes no head: the two timed models would be the same")
    if 1 not in entries:
        raise ConfigError(
            f"speed.mask_file={path}: the chosen mask removes every head ({len(entries)}): nothing would be left to time "
            "(as speed.fraction=1 is refused); choose a mask that keeps some heads"
        )


# ---- the other experiments ----------------------------------------------------------------------


def check_ablate(cfg) -> None:
    splits = cfg.ablate.splits
    if not splits:
        raise ConfigError("ablate.splits is empty: give at least one evaluation split (e.g. [eval])")
    check_splits(cfg, splits, "ablate.splits")


def check_keep_one(cfg) -> None:
    check_selection(cfg, "keep_one")


def check_trainer(trainer) -> None:
    """Training must end, on a device this machine has: an unbounded epoch count needs trainer.max_steps or trainer.max_time."""
    import torch

    accelerator = str(trainer.get("accelerator") or "cpu")
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator={accelerator} asks for a GPU, but there is no GPU here: use trainer=cpu (or trainer=ddp_cpu)"
        )
    epochs = trainer.get("max_epochs")
    if epochs is None:
        return  # Lightning's own default (1000 epochs, or max_steps)
    integer(epochs, "trainer.max_epochs", -1)
    if epochs == 0:
        raise ConfigError("trainer.max_epochs=0 trains nothing: give at least 1 epoch")
    steps = trainer.get("max_steps")
    if epochs < 0 and (steps is None or steps < 1) and not trainer.get("max_time"):
        raise ConfigError(
            "trainer.max_epochs=-1 trains forever: bound it with trainer.max_steps=<n> or "
            "+trainer.max_time=DD:HH:MM:SS, or give a number of epochs"
        )


def check_training(cfg) -> None:
    check_trainer(cfg.trainer)


def check_study(cfg) -> None:
    """experiment=study: its selection split, its training, and the settings of other experiments it would ignore."""
    check_selection(cfg, "study")  # a resumed study's damaged stage files are named and recomputed, not errors
    if cfg.study.train:
        check_trainer(study_training_config(cfg).trainer)
    if cfg.prune.reestimate:
        raise ConfigError("the study re-estimates with study.reestimate=true (one more curve per order); prune.reestimate is ignored here")
    speed = cfg.speed
    if speed.get("mask_file") or speed.get("mask_step") is not None or speed.mask_order != "importance":
        raise ConfigError(
            "the study times the importance order's mask at speed.fraction: speed.mask_file, speed.mask_step and "
            "speed.mask_order belong to experiment=speed; drop them here"
        )


# ---- the whole config ---------------------------------------------------------------------------


def check_export(cfg) -> None:
    """experiment=export: what the model kind allows, then the export's own checks (headprune.experiments.export.check)."""
    from headprune.experiments.export import check

    fmt, kind = cfg.export.get("format"), cfg.model.get("kind")
    if fmt in ("hf", "gguf") and kind != "causal_lm":
        from headprune.export.hf import not_stock_message

        raise ConfigError(not_stock_message(f"{cfg.model.get('name')} ({kind})").replace("export.format=hf", f"export.format={fmt}"))
    if str(cfg.export.get("quantize") or "none") == "int8" and kind == "seq2seq":
        raise ConfigError(
            "export.quantize=int8 is checked by the task's metric through ONNX Runtime; BLEU needs beam search, which "
            "the cache-free ONNX graphs do not run: export seq2seq models in f32 (export.quantize=none)"
        )
    check(cfg)
    check_splits(cfg, [cfg.export.split], "export.split")


def check_dynamics(cfg) -> None:
    """experiment=dynamics: its checkpoints (headprune.experiments.dynamics.check), and the task they are scored on."""
    from headprune.experiments.dynamics import check

    check(cfg)
    if cfg.get("checkpoints"):
        check_task(cfg, Run())


@dataclass(frozen=True)
class Run:
    """What an entry point reads: the model, a task (its data), and its own checks of settings that depend on each other."""

    checks: tuple[Callable, ...] = ()
    model: bool = True
    task: bool = True
    importance: bool = True  # reads the task's importance subset (head scores, held-out choices): it must not be empty
    falls_back: bool = False  # the study replaces missing local data with synthetic data: its files are not read


RUNS = {  # a task's trainer (TaskSpec.train) and other entry points: see run_of
    "headprune.experiments.inspect.run": Run(task=False),
    "headprune.experiments.dynamics.run": Run((check_dynamics,), model=False, task=False),
    "headprune.viz.report.run": Run(model=False, task=False),
    "headprune.experiments.ablate.run": Run((check_unit, check_ablate), importance=False),
    "headprune.experiments.keep_one.run": Run((check_unit, check_keep_one)),
    "headprune.experiments.prune.run": Run((check_unit, check_exact_pruning, check_prune, check_prune_for_speed)),
    "headprune.experiments.speed.run": Run((check_unit, check_exact_pruning, check_speed_run)),
    "headprune.experiments.export.run": Run((check_exact_pruning, check_export)),
    "headprune.experiments.study.run": Run(
        (check_unit, check_exact_pruning, check_study, check_prune, check_prune_for_speed, check_speed_run), falls_back=True
    ),
}


def run_of(cfg) -> Run:
    """The checks of ``cfg.run``: a known experiment, a task's trainer, or another entry point (its data when it has some)."""
    from headprune.tasks.registry import TASKS

    name = str(cfg.get("run"))
    if name in RUNS:
        return RUNS[name]
    if any(name == spec.train for spec in TASKS.values()):
        return Run((check_training,), importance=False)
    return Run(task=cfg.get("data") is not None)


def unset_empty_target(cfg) -> None:
    """``prune.target`` with every kind null (the YAML default, so that ``prune.target.speedup=1.3`` works) is no target."""
    prune = cfg.get("prune")
    if prune is not None and prune.get("target") is not None and given_target(prune.target) is None:
        prune.target = None


def validate(cfg) -> None:
    """Check a composed experiment config before any work; the first problem is a ConfigError naming the setting."""
    unset_empty_target(cfg)
    warn_unknown_keys(cfg)
    check_schema(cfg, SCHEMA)
    run = run_of(cfg)
    if run.model:
        check_device(cfg)
        check_model(cfg)
    if run.task:
        check_task(cfg, run)
    for check in run.checks:
        check(cfg)
