"""One check of a composed experiment config before any work: settings, data files and the model directory.

``validate(cfg)`` is called by the ``headprune`` entry point for every experiment (each stage of a
study included). It reads no model weights and runs no forward pass: types, ranges and choices of
the settings, the model directory (config, weights, tokenizer) and the data files (readable, UTF-8,
aligned) are checked, and the first problem is raised as a ``ConfigError`` naming the setting.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from headprune.core.checks import ConfigError, choice, fractions, integer, number, string_list
from headprune.experiments.study import study_training_config
from headprune.lightning.loggers import LOGGER_KINDS
from headprune.results.readers import check_mask_file, read_json_file
from headprune.selection.mask_search import given_target

NLI_SPLITS = ("train", "importance", "eval", "eval_mismatched")
MT_SPLITS = ("train", "valid", "test", "eval", "heldout")
LM_SPLITS = ("eval", "eval_other", "importance", "heldout", "train")
CLOCKS = ("wall", "process")
TRAINING_RUNS = ("headprune.tasks.mt.task.train", "headprune.tasks.nli.task.finetune")
DATA_RUNS = TRAINING_RUNS + tuple(
    f"headprune.experiments.{name}.run" for name in ("ablate", "keep_one", "prune", "speed", "study", "export")
)
NO_TASK_RUNS = ("headprune.experiments.inspect.run", "headprune.experiments.dynamics.run", "headprune.viz.report.run")


# ---- sections -----------------------------------------------------------------------------------


def check_bootstrap(section, prefix: str) -> None:
    integer(section.get("n_samples"), f"{prefix}.n_samples", 1)
    number(section.get("alpha"), f"{prefix}.alpha", 0.0, 1.0, "()")


def check_prune(prune, heads: int | None) -> None:
    from headprune.experiments.orders import ORDERS

    for order in string_list(prune.get("order"), "prune.order"):
        choice(order, "prune.order", ORDERS)
    if prune.get("fractions") is not None:
        fractions(prune.fractions, "prune.fractions")
    else:
        number(prune.get("step"), "prune.step", 0.0, 1.0, "()")
        number(prune.get("max_fraction", 0.9), "prune.max_fraction", 0.0, 1.0)
    string_list(prune.get("groups") or [], "prune.groups")
    k = integer(prune.get("min_heads_per_layer") or 0, "prune.min_heads_per_layer", 0)
    if heads is not None and k >= heads:
        raise ConfigError(
            f"prune.min_heads_per_layer={k} keeps every head: the model's layers have {heads} heads, "
            f"so it must be at most {heads - 1} (0 = no floor)"
        )
    integer(prune.get("n_samples", 1000), "prune.n_samples", 1)


RECOVERIES = ("none", "lsq", "finetune")
COSTS = ("flops", "latency")


def target_of(value, name: str):
    """A validated ``PruneTarget`` from a one-key mapping, or a ConfigError naming the setting."""
    from headprune.selection.mask_search import PruneTarget

    try:
        return PruneTarget.from_config(OmegaConf.to_container(value) if OmegaConf.is_config(value) else value)
    except ValueError as err:
        raise ConfigError(f"{name}: {err}") from None


def schedule_of(value) -> list:
    """The validated ``prune.schedule``: growing fractions or targets, or a ConfigError."""
    from headprune.selection.schedule import check_schedule

    steps = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    if not isinstance(steps, (list, tuple)):
        raise ConfigError(f"prune.schedule must be a list of growing fractions or targets, e.g. [0.2, 0.4], got {steps!r}")
    try:
        return check_schedule(steps)
    except (ValueError, TypeError) as err:
        raise ConfigError(f"prune.schedule: {err}") from None


def check_prune_for_speed(cfg) -> None:
    """prune.target / schedule / cost / recover / finetune / measure_speed, and the selection split a max_drop reads."""
    prune = cfg.prune
    choice(str(prune.get("cost", "flops")), "prune.cost", COSTS)
    rearrange = prune.get("rearrange", False)
    if rearrange not in (None, "both") and not isinstance(rearrange, bool):
        raise ConfigError(f"prune.rearrange must be false, true or both, got {rearrange!r}")
    if str(prune.get("unit", "head")) != "head" and str(prune.get("cost", "flops")) == "latency":
        raise ConfigError(
            "prune.cost=latency measures its tables per query head: use prune.cost=flops with prune.unit=kv_group (or prune.unit=head)"
        )
    if rearrange and prune.get("schedule") is not None:
        raise ConfigError(
            "prune.rearrange re-chooses the heads of one-shot masks (prune.fractions or prune.target), "
            "not with prune.schedule: drop one of them"
        )
    target = given_target(prune.get("target"))
    steps = [target_of(target, "prune.target")] if target is not None else []
    if prune.get("schedule") is not None:
        if steps:
            raise ConfigError("give prune.target or prune.schedule, not both (the schedule's last step is its target)")
        steps = schedule_of(prune.schedule)
    targets = [s for s in steps if not isinstance(s, float)]
    if any(t.kind == "flops" for t in targets) and str(prune.get("cost", "flops")) != "flops":
        raise ConfigError("a flops target needs prune.cost=flops (a latency table predicts seconds, not FLOPs)")
    if any(t.kind == "max_drop" for t in targets):
        check_selection(cfg, "prune")
    for recovery in string_list(prune.get("recover") or "none", "prune.recover"):
        choice(recovery, "prune.recover", RECOVERIES)
    integer(prune.get("recover_examples", 256), "prune.recover_examples", 1)
    integer(prune.get("seq_len", 128), "prune.seq_len", 1)
    integer(prune.get("latency_batch_size", 1), "prune.latency_batch_size", 1)
    lsq = prune.get("lsq") or {}
    number(lsq.get("ridge", 1e-3), "prune.lsq.ridge", 0.0, None, "()")
    number(lsq.get("max_scale", 10.0), "prune.lsq.max_scale", 0.0, None, "()")
    finetune = prune.get("finetune") or {}
    integer(finetune.get("max_steps", 100), "prune.finetune.max_steps", 1)
    number(finetune.get("lr", 2e-5), "prune.finetune.lr", 0.0, None, "()")
    number(finetune.get("distill_weight", 0.5), "prune.finetune.distill_weight", 0.0, 1.0, "[]")
    number(finetune.get("temperature", 2.0), "prune.finetune.temperature", 0.0, None, "()")
    number(finetune.get("warmup", 0.0), "prune.finetune.warmup", 0.0, 1.0, "[)")
    if finetune.get("examples") is not None:
        integer(finetune.get("examples"), "prune.finetune.examples", 1)
    check_finetune_budget(cfg, finetune)
    check_control(cfg)
    if prune.get("measure_speed"):
        if cfg.get("speed") is None:
            raise ConfigError("prune.measure_speed=true needs the speed.* settings (experiment=prune and study have them)")
        check_speed(cfg.speed)


def check_finetune_budget(cfg, finetune) -> None:
    """prune.finetune.tokens (a positive token budget) and the LoRA settings (a rank no larger than the smallest projection)."""
    if finetune.get("tokens") is not None:
        tokens = finetune.get("tokens")
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
            raise ConfigError(
                f"prune.finetune.tokens is the fine-tune's budget of real input tokens: a positive integer such as "
                f"100000, or null for prune.finetune.examples / max_steps; got {tokens!r}"
            )
    rank = finetune.get("lora_rank")
    if rank is not None:
        integer(rank, "prune.finetune.lora_rank", 1)
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
    if finetune.get("lora_alpha") is not None:
        number(finetune.get("lora_alpha"), "prune.finetune.lora_alpha", 0.0, None, "()")
    if not isinstance(finetune.get("progress", True), bool):
        raise ConfigError(f"prune.finetune.progress must be true or false, got {finetune.get('progress')!r}")


def check_control(cfg) -> None:
    """prune.control needs a fine-tune to give the unpruned model; prune.extra_splits are other splits than prune.split."""
    prune = cfg.prune
    control = prune.get("control", False)
    if not isinstance(control, bool):
        raise ConfigError(f"prune.control must be true or false, got {control!r}")
    if control and "finetune" not in string_list(prune.get("recover") or "none", "prune.recover"):
        raise ConfigError(
            "prune.control=true gives the unpruned model the same fine-tune as the pruned ones, but prune.recover "
            f"has no finetune ({prune.get('recover')!r}): add prune.recover=finetune (or a list with it), or drop prune.control"
        )
    extra = string_list(prune.get("extra_splits") or [], "prune.extra_splits")
    check_splits(cfg, extra, "prune.extra_splits")
    if str(prune.get("split")) in extra:
        raise ConfigError(f"prune.extra_splits={extra} repeats prune.split={prune.split}: list other evaluation splits")


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


def check_unit(cfg) -> str:
    """prune.unit: head, or kv_group on a model with grouped-query attention (fewer KV heads than query heads)."""
    from headprune.core.units import UNITS

    unit = choice((cfg.get("prune") or {}).get("unit", "head"), "prune.unit", UNITS)
    fields = model_fields(cfg.model) if unit == "kv_group" else None
    if fields is not None and kv_heads_per_layer(fields) is None:
        raise ConfigError(
            f"prune.unit=kv_group needs grouped-query attention (fewer KV heads than query heads); model "
            f"{cfg.model.get('name')} has one KV head per query head: use prune.unit=head"
        )
    return unit


def check_mask_units(cfg, unit: str) -> None:
    """Every mask of speed.mask_file has one row per layer and one entry per unit (query head or KV head) of the model."""
    fields = model_fields(cfg.model)
    if fields is None:
        return
    per_layer = kv_heads_per_layer(fields) if unit == "kv_group" else fields.get("num_attention_heads")
    layers = fields.get("num_hidden_layers")
    if not isinstance(per_layer, int) or not isinstance(layers, int) or cfg.model.get("kind") != "causal_lm":
        return  # encoder-decoder groups differ in size: the task checks them when it loads the mask
    payload = read_json_file(Path(str(cfg.speed.mask_file)))
    orders = (payload.get("results") or {}).get("orders") or ((payload.get("results") or {}).get("prune") or {}).get("orders") or {}
    masks = [payload["mask"]] if "mask" in payload else [step.get("mask") or {} for o in orders.values() for step in o.get("steps", [])]
    what = "KV heads" if unit == "kv_group" else "heads"
    for mask in masks:
        for group, rows in mask.items():
            for layer, row in enumerate(rows):
                if len(row) != per_layer or len(rows) != layers:
                    raise ConfigError(
                        f"speed.mask_file={cfg.speed.mask_file}: group {group} layer {layer} has {len(row)} entries "
                        f"({len(rows)} layers); model {cfg.model.get('name')} has {layers} layers x {per_layer} {what} "
                        f"(prune.unit={unit}): KV head / head ids must be within 0..{per_layer - 1}"
                    )


def check_speed(speed) -> None:
    number(speed.get("fraction"), "speed.fraction", 0.0, 1.0)
    sizes = speed.get("batch_sizes")
    if not OmegaConf.is_list(sizes) or not list(sizes):
        raise ConfigError(f"speed.batch_sizes must be a non-empty list of positive integers, got {sizes!r}")
    if any(isinstance(size, bool) or not isinstance(size, int) or size < 1 for size in sizes):
        raise ConfigError(f"speed.batch_sizes must be positive integers, got {list(sizes)}")
    integer(speed.get("examples"), "speed.examples", 1)
    integer(speed.get("warmup"), "speed.warmup", 0)
    integer(speed.get("repeats"), "speed.repeats", 1)
    integer(speed.get("max_repeats", 100), "speed.max_repeats", 2)
    number(speed.get("max_seconds", 60), "speed.max_seconds", 0.0, None, "()")
    number(speed.get("tolerance", 0.02), "speed.tolerance", 0.0, None, "()")
    choice(str(speed.get("clock", "wall")), "speed.clock", CLOCKS)
    choice(str(speed.get("runtime") or "torch"), "speed.runtime", ("torch", "onnxruntime"))
    if speed.get("mask_file"):
        check_mask_file(speed.mask_file)


def check_importance(importance) -> None:
    from headprune.scoring.importance import REDUCTIONS

    choice(importance.get("reduce"), "importance.reduce", REDUCTIONS)


def check_logger(cfg) -> None:
    logger = cfg.get("logger")
    if logger is not None:
        choice(logger.get("kind"), "logger.kind", LOGGER_KINDS)


def check_trainer(trainer) -> None:
    """Training must end: an unbounded epoch count needs trainer.max_steps or trainer.max_time."""
    epochs = trainer.get("max_epochs")
    if epochs is None:
        return  # Lightning's own default (1000 epochs, or max_steps)
    integer(epochs, "trainer.max_epochs", -1)
    if epochs == 0:
        raise ConfigError("trainer.max_epochs=0 trains nothing: give at least 1 epoch")
    steps = trainer.get("max_steps", -1)
    if epochs < 0 and (steps is None or steps < 1) and not trainer.get("max_time"):
        raise ConfigError(
            "trainer.max_epochs=-1 trains forever: bound it with trainer.max_steps=<n> or "
            "+trainer.max_time=DD:HH:MM:SS, or give a number of epochs"
        )


# ---- splits -------------------------------------------------------------------------------------


def concrete_split(cfg, split: str) -> str:
    """The data split a protocol name reads (MT ``eval`` -> test, ``heldout`` -> valid), or a ConfigError."""
    if is_mt(cfg):
        from headprune.tasks.mt.config import split_of

        choice(split, "split", MT_SPLITS)
        return split_of(cfg.data, split)
    choice(split, "split", splits_of(cfg))
    return split


def check_selection(cfg, section: str) -> None:
    """The selection split (appendix A) must differ from the evaluation split."""
    settings = cfg[section]
    split = str(settings.get("split"))
    selection = settings.get("selection_split") or ("heldout" if is_mt(cfg) else "importance")
    try:
        same = concrete_split(cfg, str(selection)) == concrete_split(cfg, split)
    except ConfigError as err:
        raise ConfigError(f"{section}: {err} (splits: {list(splits_of(cfg))})") from None
    if same:
        raise ConfigError(
            f"{section}.selection_split={selection} reads the same data as {section}.split={split}: "
            "choose the head on other data (null = the task's held-out data)"
        )


def check_splits(cfg, names, setting: str) -> None:
    for name in names:
        try:
            concrete_split(cfg, str(name))
        except ConfigError:
            raise ConfigError(f"{setting}: unknown split {name!r}; choose from {list(splits_of(cfg))}") from None


# ---- model --------------------------------------------------------------------------------------


def splits_of(cfg) -> tuple[str, ...]:
    """The split names the config's task reads."""
    return MT_SPLITS if is_mt(cfg) else LM_SPLITS if cfg.model.get("kind") == "causal_lm" else NLI_SPLITS


def is_mt(cfg) -> bool:
    return cfg.model.get("kind") == "seq2seq"


def check_model(cfg) -> None:
    """model.kind, and a pretrained model that exists and is complete (config, weights, tokenizer)."""

    model = cfg.model
    choice(model.get("kind"), "model.kind", ("classifier", "seq2seq", "causal_lm"))
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
        if is_mt(cfg) and (cfg.get("data") or {}).get("tokenizer", {}).get("path"):
            own_tokenizer = False  # data.tokenizer.path gives the tokenizer
        check_model_dir(source, tokenizer=own_tokenizer)
    elif model.get("config") is None:
        raise ConfigError(f"model {model.get('name')!r} sets neither model.pretrained nor model.config: set one of them")
    if model.get("tokenizer") or model.get("kind") == "classifier":  # MT and LM models built fresh train their own tokenizer
        tokenizer_source(model)


def model_fields(model_cfg) -> dict | None:
    """The model's config fields: model.config, or the local model's config.json (None: unknown, e.g. a hub name)."""
    fields = model_cfg.get("config")
    if fields is None and model_cfg.get("pretrained") and not str(model_cfg.pretrained).endswith(".ckpt"):
        from headprune.models.sources import resolve_pretrained

        path = Path(resolve_pretrained(str(model_cfg.pretrained))) / "config.json"
        if not path.is_file():
            return None
        fields = read_json_file(path)
    return None if fields is None else dict(fields)


def kv_heads_per_layer(fields: dict) -> int | None:
    """KV heads per layer of a grouped-query model's config fields (None: one KV head per query head)."""
    kv, heads = fields.get("num_key_value_heads"), fields.get("num_attention_heads")
    return int(kv) if isinstance(kv, int) and isinstance(heads, int) and kv < heads else None


def heads_per_layer(model_cfg, unit: str = "head") -> int | None:
    """The fewest heads (``unit=kv_group``: KV heads) of any attention group, from the model's config fields (None: unknown)."""
    fields = model_fields(model_cfg)
    if fields is None:
        return None
    if unit == "kv_group":
        return kv_heads_per_layer(fields)
    counts = [fields.get(key) for key in ("num_attention_heads", "encoder_attention_heads", "decoder_attention_heads")]
    counts = [int(c) for c in counts if isinstance(c, int)]
    return min(counts) if counts else None


# ---- data ---------------------------------------------------------------------------------------


def check_data(cfg, check_files: bool = True) -> None:
    """The data settings, and (``check_files``) every split's files: present, UTF-8, aligned."""
    from headprune.tasks.registry import task_spec

    try:
        name = task_spec(cfg).name
    except ValueError as err:
        raise ConfigError(str(err)) from None
    DATA_CHECKS[name](cfg.data, check_files)


def check_mt_data(data, check_files: bool) -> None:
    from headprune.tasks.mt.config import SPLITS, split_limit

    for split in SPLITS:
        try:
            split_limit(data, split)
        except ValueError as err:
            raise ConfigError(str(err)) from None
    for key in ("max_tokens", "eval_max_tokens", "eval_batch_size", "max_len"):
        integer(data.get(key), f"data.{key}", 1)
    choice(data.get("source"), "data.source", ("files", "hub", "synthetic"))
    if data.source != "files" or not check_files:
        return
    from headprune.tasks.mt.files import read_aligned

    for split in SPLITS:
        try:
            read_aligned(data.dir, data.splits[split], data.src_lang, data.tgt_lang)
        except (OSError, ValueError) as err:
            raise ConfigError(f"data split {split!r}: {err}") from None


def check_nli_data(data, check_files: bool) -> None:
    from headprune.tasks.nli.config import REQUIRED, SPLITS, NLIDataConfig
    from headprune.tasks.nli.files import find_split_file
    from headprune.tasks.text_lines import check_utf8

    try:
        config = NLIDataConfig.from_cfg(data)
    except (TypeError, ValueError) as err:
        raise ConfigError(str(err)) from None
    if config.source != "local" or not check_files:
        return
    for split in SPLITS:
        stem = config.files.get(split)
        if not stem:
            continue
        try:
            check_utf8(find_split_file(config.dir, stem, split))
        except FileNotFoundError as err:
            if split in REQUIRED:
                raise ConfigError(str(err)) from None
        except (OSError, ValueError) as err:
            raise ConfigError(str(err)) from None


# ---- the whole config ---------------------------------------------------------------------------


def check_lm_data(data, check_files: bool) -> None:
    """Language-modelling data: positive limits, and (local files) every split's texts readable before any work."""
    for split, limit in dict(data.get("limits") or {}).items():
        if limit is not None:
            integer(limit, f"data.limits.{split}", low=1)
    if check_files and data.get("source") in ("local", "synthetic"):
        from headprune.tasks.lm.data import load_texts

        try:
            load_texts(data)
        except (ValueError, OSError) as err:
            raise ConfigError(f"data={data.get('name')}: {err}") from None


def check_lm_task(task) -> None:
    """The language-modelling task settings (conf/task/lm.yaml): positive counts, a selection split other than eval."""
    integer(task.get("mask_chunk"), "task.mask_chunk", 1)
    integer(task.get("decode_tokens"), "task.decode_tokens", 1)
    integer(task.get("decode_prompt_tokens"), "task.decode_prompt_tokens", 1)
    choice(task.get("selection_split"), "task.selection_split", ("importance", "heldout"))


DATA_CHECKS = {"nli": check_nli_data, "mt": check_mt_data, "lm": check_lm_data}  # task name -> its data check


def check_export(cfg) -> None:
    """experiment=export: what the model kind allows, then the export's own checks (headprune.experiments.export.check)."""
    from headprune.experiments.export import check

    fmt, kind = cfg.export.get("format"), cfg.model.get("kind")
    if fmt in ("hf", "gguf") and kind != "causal_lm":
        from headprune.export.hf import not_stock_message

        raise ConfigError(not_stock_message(f"{cfg.model.get('name')} ({kind})").replace("export.format=hf", f"export.format={fmt}"))
    if str(cfg.export.get("quantize") or "none") == "int8" and is_mt(cfg):
        raise ConfigError(
            "export.quantize=int8 is checked by the task's metric through ONNX Runtime; BLEU needs beam search, which "
            "the cache-free ONNX graphs do not run: export seq2seq models in f32 (export.quantize=none)"
        )
    check(cfg)
    check_splits(cfg, [cfg.export.split], "export.split")


def unset_empty_target(cfg) -> None:
    """``prune.target`` with every kind null (the YAML default, so that ``prune.target.speedup=1.3`` works) is no target."""
    prune = cfg.get("prune")
    if prune is not None and prune.get("target") is not None and given_target(prune.target) is None:
        prune.target = None


def validate(cfg) -> None:
    """Check a composed experiment config before any work; the first problem is a ConfigError naming the setting."""
    run = str(cfg.get("run"))
    unset_empty_target(cfg)
    check_logger(cfg)
    integer(cfg.get("seed", 0), "seed")
    if run in NO_TASK_RUNS:
        if run == "headprune.experiments.inspect.run":
            check_model(cfg)
        return
    check_model(cfg)
    study = run == "headprune.experiments.study.run"
    local_missing = (cfg.get("data") or {}).get("source") == "local" and not Path(str(cfg.data.get("dir"))).exists()
    if run in DATA_RUNS or cfg.get("data") is not None:
        check_data(cfg, check_files=not (study and local_missing))  # the study falls back to synthetic data
    if run in TRAINING_RUNS:
        check_trainer(cfg.trainer)
    if cfg.model.get("kind") == "causal_lm" and cfg.get("task") is not None:
        check_lm_task(cfg.task)
    if study and cfg.study.get("train"):
        check_trainer(study_training_config(cfg).trainer)
    if cfg.get("importance") is not None and run not in TRAINING_RUNS:
        check_importance(cfg.importance)
    unit = check_unit(cfg) if run in DATA_RUNS else "head"
    if "prune" in cfg:
        choice(str(cfg.prune.get("layout") or "global"), "prune.layout", ("global", "uniform"))
    if "prune" in cfg and run in ("headprune.experiments.prune.run", "headprune.experiments.study.run"):
        check_prune(cfg.prune, heads_per_layer(cfg.model, unit))
        check_splits(cfg, [cfg.prune.split, cfg.prune.get("ablation_split", cfg.prune.split)], "prune.split/ablation_split")
        check_prune_for_speed(cfg)
    if run == "headprune.experiments.ablate.run":
        check_bootstrap(cfg.ablate, "ablate")
        splits = string_list(cfg.ablate.get("splits") or [], "ablate.splits")
        if not splits:
            raise ConfigError("ablate.splits is empty: give at least one evaluation split (e.g. [eval])")
        check_splits(cfg, splits, "ablate.splits")
    if run == "headprune.experiments.keep_one.run":
        check_bootstrap(cfg.keep_one, "keep_one")
        check_selection(cfg, "keep_one")
    if "speed" in cfg and run in ("headprune.experiments.speed.run", "headprune.experiments.study.run"):
        check_speed(cfg.speed)
        check_splits(cfg, [cfg.speed.split], "speed.split")
        if cfg.speed.get("mask_file"):
            check_mask_units(cfg, unit)
    if run == "headprune.experiments.export.run":
        check_export(cfg)
    if study:
        check_bootstrap(cfg.study, "study")
        check_selection(cfg, "study")  # a resumed study's damaged stage files are named and recomputed, not errors
