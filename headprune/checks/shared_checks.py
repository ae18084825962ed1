"""Checks every experiment shares: top-level keys, the device, the model, the task and its splits, the unit, the trainer."""

import importlib.util
import zipfile
from functools import cache, lru_cache
from pathlib import Path

import torch
from hydra.utils import get_method
from omegaconf import OmegaConf

from headprune.checks.stream_checks import check_stream
from headprune.conf_dir import config_dir
from headprune.core.checks import ConfigError, check_schema, no_duplicates, warn  # noqa: F401 (no_duplicates re-exported)
from headprune.core.families import FAMILIES, GROUPS, config_groups, supported_model_types
from headprune.core.pruning import inexact_reason
from headprune.core.unit_kinds import KINDS, ablation_refusal
from headprune.models.build import tokenizer_source
from headprune.models.sources import check_model_dir, config_fields, resolve_pretrained
from headprune.results.readers import read_json_file
from headprune.settings.declare import TRAINING
from headprune.settings.schema import SCHEMA, checked_groups, is_read, read_by, reads_of
from headprune.sources.orders import ORDERS, action_refusal, unit_refusal
from headprune.tasks.registry import DATA_TASKS, TASKS, model_task, task_spec
from headprune.tasks.stream_task import STREAM

# ---- keys ---------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def known_keys() -> frozenset[str]:
    """Every top-level key a config group can set: config.yaml's, the groups' names and the keys of ``@package _global_`` files."""
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


# ---- device, model ------------------------------------------------------------------------------


def check_device(cfg) -> None:
    """``device`` names a device this machine has (``auto``: CUDA when there is one)."""
    name = str(cfg.device)
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


ATTENTION_IMPLEMENTATIONS = ("eager", "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention")
FLASH_ATTENTION = {"flash_attention_2": ("flash_attn", "flash-attn"), "flash_attention_3": ("flash_attn_interface", "flash-attn-3")}


def check_model(cfg) -> None:
    """The model's kind (a task), its attention implementation (FlashAttention: its package and a CUDA GPU), type and complete files."""
    try:
        model_task(cfg.model)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    implementation = cfg.model.get("attn_implementation")
    if implementation is not None and implementation not in ATTENTION_IMPLEMENTATIONS:
        raise ConfigError(
            f"model.attn_implementation={implementation} is no attention implementation of transformers: "
            f"choose one of {list(ATTENTION_IMPLEMENTATIONS)} (or null for the model's default)"
        )
    if implementation in FLASH_ATTENTION:  # refused before the model is built when the package or the GPU is missing
        module, package = FLASH_ATTENTION[implementation]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                f"model.attn_implementation={implementation} needs the {package} package, which is not installed here: "
                f"install it on a machine with a CUDA GPU (pip install {package}), or use model.attn_implementation=sdpa"
            )
        if not torch.cuda.is_available() or str(cfg.get("device")).startswith("cpu"):
            raise ConfigError(
                f"model.attn_implementation={implementation} runs on a CUDA GPU only (device={cfg.get('device')}, "
                f"{'no GPU here' if not torch.cuda.is_available() else 'the CPU asked'}): use model.attn_implementation=sdpa"
            )
    model, pretrained = cfg.model, cfg.model.get("pretrained")
    try:
        if pretrained and str(pretrained).endswith(".ckpt"):
            path = resolve_pretrained(str(pretrained))  # a training checkpoint: it must exist, a whole zip archive
            if not zipfile.is_zipfile(path):
                raise ConfigError(
                    f"model.pretrained={pretrained}: {path} is no readable checkpoint (damaged or truncated): use another "
                    "checkpoint of the run (<run>/checkpoints/), or train again"
                )
        elif pretrained:  # a model directory: its model type (a hub model's is known once loaded), then its files
            source = resolve_pretrained(str(pretrained))
            config_file = Path(source) / "config.json"
            if config_file.is_file():
                check_model_type(read_json_file(config_file), str(config_file))
            given = ((cfg.get("data") or {}).get("tokenizer") or {}).get("path")  # data.tokenizer.path gives the tokenizer
            own_tokenizer = not given and (not model.get("tokenizer") or str(model.get("tokenizer")) == str(pretrained))
            check_model_dir(source, tokenizer=own_tokenizer)
        elif model.get("config") is None:
            raise ConfigError(f"model {model.get('name')!r} sets neither model.pretrained nor model.config: set one of them")
        else:
            check_model_type(dict(model.config), "model.config")
        if model.get("tokenizer"):  # models built fresh without one train their own (MT, LM); the NLI task requires one
            tokenizer_source(model)
    except ModuleNotFoundError as err:  # an embedded model's package or its GGUF reader is not installed
        raise ConfigError(str(err)) from None


def check_model_type(fields: dict, config_file: str) -> None:
    """The model type of a model's config fields (read from ``config_file``) is one the family table covers."""
    model_type = fields.get("model_type")
    if model_type not in supported_model_types():
        raise ConfigError(
            f"{config_file} says model_type={model_type!r}, which headprune does not support (no row of "
            f"headprune/core/families.py covers it): use a model of one of the supported types "
            f"{', '.join(supported_model_types())}"
        )


# ---- the task -----------------------------------------------------------------------------------


def task_spec_of(cfg):
    """The TaskSpec of the model, fitting the chosen data, or a ConfigError."""
    try:
        return task_spec(cfg)
    except ValueError as err:
        raise ConfigError(str(err)) from None


def check_task(cfg, reads_importance: bool = True, falls_back: bool = False) -> None:
    """The task's own check (``TaskSpec.check``): its settings, data files (unless a study falls back) and lengths."""
    spec = task_spec_of(cfg)
    local_missing = cfg.data.get("source") == "local" and not Path(str(cfg.data.get("dir"))).exists()
    get_method(spec.check)(cfg, files=not (falls_back and local_missing), importance=reads_importance)


def check_model_and_task(cfg, reads_importance: bool = True, falls_back: bool = False, reader: str | None = None) -> None:
    """The device, the model, the task (``reads_importance``: its importance subset is read), no setting ``reader`` ignores given."""
    check_device(cfg)
    check_model(cfg)
    check_task(cfg, reads_importance=reads_importance, falls_back=falls_back)
    check_reads(cfg, reader)


def concrete_split(cfg, split: str) -> str:
    """The data split a split name reads (e.g. MT ``eval`` -> test, ``heldout`` -> valid), or a ConfigError."""
    spec = task_spec_of(cfg)
    if split not in spec.splits:
        raise ConfigError(f"split must be one of {list(spec.splits)}, got {split!r}")
    return get_method(spec.data_split)(cfg.data, split) if spec.data_split else split


def check_splits(cfg, names, setting: str) -> None:
    """Every split name is one the task reads, and in the chosen data (its table of files or synthetic sizes, where it has one)."""
    data = cfg.get("data") or {}
    where = {"local": "data.files", "synthetic": "data.synthetic.sizes"}.get(str(data.get("source")))  # else its task checks them
    table = data.get("files") if data.get("source") == "local" else (data.get("synthetic") or {}).get("sizes")
    for name in names:
        try:
            concrete = concrete_split(cfg, str(name))
        except ConfigError:
            raise ConfigError(f"{setting}: unknown split {name!r}; choose from {list(task_spec_of(cfg).splits)}") from None
        if where is not None and OmegaConf.is_dict(table) and table.get(concrete) is None:
            have = sorted(k for k in table if table[k] is not None)
            raise ConfigError(
                f"{setting}: split {name!r} is not in data {data.get('name')} ({where} has {have}): drop it, or choose data that has it"
            )


def check_selection(cfg, section: str) -> None:
    """The selection split (appendix A) must differ from the evaluation split."""
    settings = cfg[section]
    split = str(settings.get("split"))
    selection = settings.get("selection_split") or (cfg.get("task") or {}).get("selection_split") or task_spec_of(cfg).selection
    try:
        same = concrete_split(cfg, str(selection)) == concrete_split(cfg, split)
    except ConfigError as err:
        raise ConfigError(f"{section}: {err} (splits: {list(task_spec_of(cfg).splits)})") from None
    if same:
        raise ConfigError(
            f"{section}.selection_split={selection} reads the same data as {section}.split={split}: "
            "choose the head on other data (null = the task's held-out data)"
        )


# ---- units --------------------------------------------------------------------------------------


def check_unit(cfg, prune, single_units: bool = False, orders: bool = True) -> None:
    """``prune``'s unit and action on this model, its orders (``orders``), one unit at a time (``single_units``: ablate, keep_one)."""
    if prune.action == STREAM:
        check_stream(cfg, prune)
    else:
        refuse_given(
            cfg,
            ("prune.stream",),
            "prune.stream.* sets what a streamed unit still sees, and prune.action=remove removes units (add prune.action=stream)",
        )
    unit, fields = prune.unit, config_fields(cfg.model)
    for kind in unit.kinds:
        refusal = kind.refusal(fields, prune.given) if fields is not None else None
        if refusal:
            raise ConfigError(f"prune.unit={unit} on model {cfg.model.get('name')}: {refusal}")
        layout = kind.layout_refusal.get(str(prune.given.get("layout")))
        if layout:
            raise ConfigError(layout)
    refusal = ablation_refusal(unit)
    if refusal and single_units:
        raise ConfigError(f"experiment={cfg.get('experiment_name')} removes one unit at a time, and prune.unit={unit}: {refusal}")
    for order in prune.orders if orders else ():
        refusals = {f"prune.unit={unit}": unit_refusal(order, unit), f"prune.action={prune.action}": action_refusal(order, prune.action)}
        for setting, refused in refusals.items():
            if refused:
                raise ConfigError(f"prune.order={order} with {setting}: {refused}")
        check_order_data(cfg, order)


def check_order_data(cfg, order: str) -> None:
    """An order that reads a score of the task's data (retrieval: needles) needs a task whose data has it (or prune.scores_from)."""
    needs = ORDERS[order].needs if order in ORDERS else None
    if not needs or (cfg.get("prune") or {}).get("scores_from") is not None:
        return  # it reads nothing of the data, or its scores are read from the file, not computed on this task's data
    spec = task_spec_of(cfg)
    if needs not in spec.head_scores:
        having = [s.data_choices for s in (*TASKS.values(), *DATA_TASKS.values()) if needs in s.head_scores]
        raise ConfigError(
            f"prune.order={order} scores how often each head's attention peaks on the needle token it copies, and "
            f"data={cfg.data.get('name')} (the {spec.name} task) has no needles: use {' or '.join(having)}"
        )


def check_group_names(cfg, unit, groups, setting: str) -> None:
    """A list of mask groups (empty: all) names each once, each a group of ``unit`` that the model has (from its config fields)."""
    no_duplicates(groups, setting)
    fields = config_fields(cfg.model)
    attention = (config_groups(fields) if fields is not None else None) or list(GROUPS)
    have = [g for kind in unit.kinds for g in kind.group_names(attention)]
    unknown = [str(g) for g in groups if str(g) not in have]
    if unknown:
        raise ConfigError(
            f"{setting}={[str(g) for g in groups]} names {unknown}, but model {cfg.model.get('name')} has the {unit} "
            f"groups {have} (its attention groups: {attention}): choose among them (empty = all)"
        )


def check_mask_units(cfg, unit, mask: dict) -> None:
    """A mask of ``unit`` on a model with one attention group has one row per layer and one entry per unit (query head or KV head)."""
    kinds = unit.kinds
    if len(kinds) != 1 or not kinds[0].layer_rows:
        return  # joint masks and the residual stream's one row: their groups are checked when the task loads the mask
    fields = config_fields(cfg.model) or {}
    per_layer = kinds[0].units_per_layer(fields)
    layers = fields.get("num_hidden_layers")
    if not isinstance(per_layer, int) or not isinstance(layers, int) or len(mask) != 1:
        return  # encoder-decoder groups differ in size: the task checks them when it loads the mask
    for group, rows in mask.items():
        for layer, row in enumerate(rows):
            if len(row) != per_layer or len(rows) != layers:
                raise ConfigError(
                    f"speed.mask_file={cfg.speed.mask_file}: group {group} layer {layer} "
                    f"has {len(row)} entries ({len(rows)} layers); model {cfg.model.get('name')} has {layers} layers x "
                    f"{per_layer} {kinds[0].noun}s (prune.unit={unit}): KV head / head ids must be within 0..{per_layer - 1}"
                )


# ---- training -----------------------------------------------------------------------------------


def check_trainer(trainer) -> None:
    """Training must end, on a device this machine has: an unbounded epoch count needs trainer.max_steps or trainer.max_time."""
    accelerator = str(trainer.accelerator)
    if accelerator in ("gpu", "cuda") and not torch.cuda.is_available():
        raise ConfigError(
            f"trainer.accelerator={accelerator} asks for a GPU, but there is no GPU here: use trainer=cpu (or trainer=ddp_cpu)"
        )

    check_schema({"trainer": trainer}, {key: rule for key, rule in SCHEMA.items() if key.startswith("trainer.")})  # with train_overrides
    epochs = trainer.get("max_epochs")
    if epochs is None:
        return  # Lightning's own default (1000 epochs, or max_steps)
    if epochs == 0:
        raise ConfigError("trainer.max_epochs=0 trains nothing: give at least 1 epoch")
    steps = trainer.get("max_steps")
    if epochs < 0 and (steps is None or steps < 1) and not trainer.get("max_time"):
        raise ConfigError(
            "trainer.max_epochs=-1 trains forever: bound it with trainer.max_steps=<n> or "
            "+trainer.max_time=DD:HH:MM:SS, or give a number of epochs"
        )


def check_training_run(cfg) -> None:
    """A task's trainer (``TaskSpec.train``): the model, the task's own check, the trainer, and a checkpoint to resume."""
    check_model_and_task(cfg, reads_importance=False, reader=TRAINING)
    check_trainer(cfg.trainer)
    path = cfg.get("ckpt_path")  # ckpt_path=last resumes <output_dir>/checkpoints/last.ckpt: it must exist (a path too)
    target = Path(str(cfg.paths.output_dir)) / "checkpoints" / "last.ckpt" if str(path) == "last" else Path(str(path))
    if path is not None and not target.is_file():
        raise ConfigError(
            f"ckpt_path={path}: there is nothing to resume ({target} does not exist): give the run's own directory "
            "(hydra.run.dir=<run>) with ckpt_path=last, a checkpoint file, or drop ckpt_path to train from the start"
        )


# ---- settings a run does not read -----------------------------------------------------------------


@lru_cache(maxsize=1)
def root_choices() -> dict[str, str]:
    """{group: the file config.yaml picks for it} (e.g. trainer: cpu); other groups' default file is ``default.yaml``."""
    entries = OmegaConf.to_container(OmegaConf.load(Path(config_dir()) / "config.yaml")).get("defaults", [])
    return {k: str(v) for entry in entries if isinstance(entry, dict) for k, v in entry.items()}


@lru_cache(maxsize=1)
def experiment_files() -> dict[str, tuple[str, dict]]:
    """{entry point: (experiment name, its file's settings)} for every file of conf/experiment/."""
    files = {path.stem: OmegaConf.to_container(OmegaConf.load(path)) for path in sorted((Path(config_dir()) / "experiment").glob("*.yaml"))}
    return {str(settings.get("run")): (name, settings) for name, settings in files.items()}


@cache
def group_defaults(run: str, group: str) -> dict:
    """The composed default of a settings group for an entry point: conf/<group>/default.yaml, then its experiment file's."""
    path = Path(config_dir()) / group / f"{root_choices().get(group, 'default')}.yaml"
    base = OmegaConf.load(path) if path.is_file() else OmegaConf.create({})
    base.pop("defaults", None)
    own = experiment_files().get(run, ("", {}))[1].get(group) or {}
    return OmegaConf.to_container(OmegaConf.merge(base, own))


def leaves(node, prefix: str) -> dict[str, object]:
    """{dotted key: value} of every leaf of a mapping (lists are leaves)."""
    if not isinstance(node, dict):
        return {prefix: node}
    return {key: leaf for name, child in node.items() for key, leaf in leaves(child, f"{prefix}.{name}").items()}


def given_settings(cfg, group: str) -> dict[str, object]:
    """{dotted key: value} of a group's settings that differ from the run's composed default."""
    node = cfg.get(group)
    if node is None or not OmegaConf.is_dict(node):
        return {}
    defaults = leaves(group_defaults(str(cfg.get("run")), group), group)
    given = leaves(OmegaConf.to_container(node, resolve=False), group)
    return {
        key: value
        for key, value in given.items()
        if (key in defaults and defaults[key] != value) or (key not in defaults and value is not None)  # an unset target is None
    }


def experiment_name(cfg) -> str:
    """The experiment file that sets ``cfg.run`` (e.g. ``prune``)."""
    return experiment_files().get(str(cfg.get("run")), (str(cfg.get("run")), {}))[0]


def check_reads(cfg, reader: str | None = None) -> None:
    """A setting this run (``reader``: default ``cfg.run``'s, or ``TRAINING``) does not read (``read_by``), given off its default, is refused."""
    reader = reader or experiment_name(cfg)
    for group in checked_groups():
        for key, value in given_settings(cfg, group).items():
            if not read_by(key):
                raise ConfigError(
                    f"{key}={value} is no setting of {group}.* (docs/settings.md lists them): check the spelling; no experiment reads it"
                )
            if not is_read(key, reader):
                raise ConfigError(
                    f"{key}={value} is not read by experiment={experiment_name(cfg)} (it reads {reads_of(reader)}): "
                    "it would be ignored; drop it, or run the experiment that reads it"
                )


def refuse_given(cfg, keys: tuple[str, ...], why: str) -> None:
    """A conditional read: ``keys`` are read only when ``why`` says; given another value than their default otherwise, refused."""
    for group in {key.split(".")[0] for key in keys}:
        for key, value in given_settings(cfg, group).items():
            if any(key == read or key.startswith(read + ".") for read in keys):
                raise ConfigError(f"{key}={value} would be ignored: {why}; drop it")


# ---- physical pruning -----------------------------------------------------------------------------


def check_exact_pruning(cfg, what: str | None, kinds=None) -> None:
    """A run that prunes physically (``what`` says how; None: masks only) is refused on a model whose pruning is inexact (OLMo 2,
    ALiBi); ``kinds``: the unit kinds it prunes (None: any), those that keep every head pass OLMo 2's norms across heads."""
    fields = config_fields(cfg.model) or {}
    family = next((f for f in FAMILIES if fields.get("model_type") in f.model_types), None)
    if family is None or not what:
        return
    refused = [kind for kind in (KINDS.values() if kinds is None else kinds) if inexact_reason(family, fields, kind.parts)]
    if not refused:
        return
    exact = [kind.name for kind in KINDS.values() if not inexact_reason(family, fields, kind.parts)]
    named = "" if kinds is None else f"its unit removes {', '.join(f'{k.noun}s ({k.name})' for k in refused)}, and "
    exactly = f" Units of kinds {', '.join(exact)} are removed exactly (e.g. prune.unit=[{','.join(exact)}])." if exact else ""
    raise ConfigError(
        f"model {cfg.model.get('name')}: {named}{inexact_reason(family, fields, refused[0].parts)}; this run prunes physically: "
        f"{what}.{exactly} Gates, importance scores and ablation work on it: run experiment=ablate or keep_one, or "
        "experiment=prune with masks only (no prune.recover=finetune, measure_speed, schedule or cost=latency, and prune.save=none)"
    )
