"""Which task a config asks for: ``TASKS`` by ``model.kind``, ``DATA_TASKS`` by (``model.kind``, ``data.kind``)."""

from dataclasses import dataclass, replace

import torch
from hydra.utils import get_class, get_method


@dataclass(frozen=True)
class TaskSpec:
    """A task: its name, the data it reads, its splits, and the dotted paths of its loader, trainer and config check."""

    name: str  # "nli", "mt", ...
    data_kind: str | None  # the ``data.kind`` its data configs carry (None: they carry none)
    data_choices: str  # the data configs to suggest in errors
    load: str  # cfg -> Task (model with gates + data)
    train: str | None  # cfg -> metrics: fine-tune / train the model and save <output_dir>/model (None: no trainer)
    splits: tuple[str, ...]  # the split names its experiments may name (prune.split, ablate.splits, ...)
    check: str  # check(cfg, files=True, importance=True): its task.* and data.* settings, data files, lengths; ConfigError
    selection: str  # the held-out split for choices when no setting names one (never the evaluation split)
    data_split: str | None = None  # (data cfg, split) -> the data split a name reads (e.g. MT eval -> test); None: itself
    exports: tuple[str, ...] = ("onnx", "int8")  # export.format values its models take, and int8 where its metric runs in ONNX Runtime
    model_class: str | None = None  # the transformers auto class its models are built as (None: its loader builds its own)
    model_config: tuple[str, ...] = ()  # model.* settings that go into the model's config (a classifier's num_labels)
    architectures: tuple[str, ...] = ()  # how the HF architectures of its models end (config.json "architectures")
    own_length: str | None = None  # model -> (tokens, how): inputs of the model's own length (images: patches + CLS)
    head_scores: tuple[str, ...] = ()  # per-head scores its data supports beyond gradients (retrieval: needles to copy)


TASKS: dict[str, TaskSpec] = {  # keyed by model.kind
    "classifier": TaskSpec(
        "nli",
        None,
        "data=nli_synthetic|nli_local|nli_hub",
        "headprune.tasks.nli.task.load_nli_task",
        "headprune.tasks.nli.task.finetune",
        splits=("train", "importance", "eval", "eval_mismatched"),
        check="headprune.tasks.nli.config_check.check",
        selection="importance",
        model_class="transformers.AutoModelForSequenceClassification",
        model_config=("num_labels",),
        architectures=("ForSequenceClassification",),
    ),
    "seq2seq": TaskSpec(
        "mt",
        "translation",
        "data=mt_synthetic|mt_multi30k|mt_iwslt14|mt_wmt|mt_hub",
        "headprune.tasks.mt.task.load_translation_task",
        "headprune.tasks.mt.task.train",
        splits=("train", "valid", "test", "eval", "heldout"),
        check="headprune.tasks.mt.config_check.check",
        selection="heldout",
        data_split="headprune.tasks.mt.config.split_of",
        exports=("onnx",),  # BLEU needs beam search, which the cache-free ONNX graphs do not run: no int8 check
        model_class="transformers.AutoModelForSeq2SeqLM",
        architectures=("ForConditionalGeneration", "MTModel"),
    ),
    "causal_lm": TaskSpec(
        "lm",
        "lm",
        "data=lm_local|lm_synthetic|lm_hub|lm_long|passkey_synthetic|passkey_local|passkey_hub",
        "headprune.tasks.lm.task.load_lm_task",
        None,
        splits=("eval", "eval_other", "importance", "heldout", "train"),
        check="headprune.tasks.lm.config_check.check",
        selection="importance",
        exports=("onnx", "int8", "hf", "gguf", "deci_hf"),
        model_class="transformers.AutoModelForCausalLM",
        architectures=("ForCausalLM",),
    ),
    "image_classifier": TaskSpec(
        "vision",
        "image",
        "data=image_digits|image_hub",
        "headprune.tasks.vision.task.load_vision_task",
        "headprune.tasks.vision.task.finetune",
        splits=("train", "importance", "eval"),
        check="headprune.tasks.vision.config_check.check",
        selection="importance",
        model_class="transformers.AutoModelForImageClassification",
        architectures=("ForImageClassification", "ForImageClassificationWithTeacher"),
        own_length="headprune.tasks.vision.processor.own_length",
    ),
}


DATA_TASKS: dict[tuple[str, str], TaskSpec] = {  # (model.kind, data.kind): a task other than the model kind's own
    ("causal_lm", "passkey"): replace(
        TASKS["causal_lm"],
        name="passkey",
        data_kind="passkey",
        data_choices="data=passkey_synthetic|passkey_local|passkey_hub",
        load="headprune.tasks.longctx.task.load_passkey_task",
        splits=("eval", "importance", "heldout", "train"),
        check="headprune.tasks.longctx.config_check.check",
        exports=("onnx", "hf", "gguf"),  # no int8: its check scores the exports in ONNX Runtime, not wired to passkey retrieval
        head_scores=("retrieval",),  # retrieval_batches: each answer token's needle span
    ),
}


def check_model_dir_kind(fields: dict, cfg, setting: str) -> None:
    """A model directory (its config.json ``fields``) of the kind the configured task serves; else a ConfigError naming both."""
    from headprune.core.checks import ConfigError

    architectures = [str(a) for a in fields.get("architectures", ())]
    kinds = [kind for kind, spec in TASKS.items() if any(a.endswith(e) for a in architectures for e in spec.architectures)]
    if kinds and str(cfg.model.get("kind")) not in kinds:
        raise ConfigError(
            f"{setting} holds a {', '.join(architectures)} ({fields.get('model_type')}, model.kind {kinds[0]}), but "
            f"model={cfg.model.get('name')} is a {cfg.model.get('kind')} and its data another task: give a model and data "
            f"of kind {kinds[0]} ({TASKS[kinds[0]].data_choices})"
        )


def model_task(model_cfg) -> TaskSpec:
    """The task a model config's ``kind`` names, or a ValueError listing the kinds."""
    kind = model_cfg.get("kind")
    if kind not in TASKS:
        raise ValueError(f"model.kind must be one of {sorted(TASKS)}, got {kind!r}")
    return TASKS[kind]


def task_spec(cfg) -> TaskSpec:
    """The task of ``model.kind`` (or of ``DATA_TASKS`` for its data's kind), checked against the chosen data config."""
    spec = model_task(cfg.model)
    kind = cfg.model.get("kind")
    if cfg.get("data") is None:
        raise ValueError(f"no data chosen: add {spec.data_choices} for model.kind={kind}")
    if (kind, cfg.data.get("kind")) in DATA_TASKS:
        return DATA_TASKS[(kind, cfg.data.get("kind"))]
    if cfg.data.get("kind") != spec.data_kind:
        others = "".join(f", the {s.name} task {s.data_choices}" for (k, _), s in DATA_TASKS.items() if k == kind)
        raise ValueError(
            f"model {cfg.model.get('name')} ({kind}) does not fit data {cfg.data.get('name')}: "
            f"the {spec.name} task reads {spec.data_choices}{others}"
        )
    return spec


def build_task_model(model_cfg, vocab_size: int | None = None, seed: int | None = None, **overrides):
    """The model of ``model.kind``'s task: its ``TaskSpec.model_class`` built from ``model_cfg`` (headprune.models.build)."""
    from headprune.models.build import build_model

    kind = model_cfg.get("kind")
    if kind not in TASKS or TASKS[kind].model_class is None:
        known = sorted(k for k, spec in TASKS.items() if spec.model_class)
        raise ValueError(f"model.kind must be one of {known} to build its model from the config, got {kind!r}")
    spec = TASKS[kind]
    fields = {name: model_cfg[name] for name in spec.model_config}
    return build_model(model_cfg, get_class(spec.model_class), vocab_size, seed, **fields, **overrides)


def load_task(cfg):
    """The Task (model with gates + data) the config describes, in eval mode on its device, in ``prune.unit`` and ``prune.action``."""
    from headprune.tasks.stream_task import in_action

    task = get_method(task_spec(cfg).load)(cfg)
    device = str(cfg.device)  # auto (default): CUDA when available, else CPU
    task.to(torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device))
    task.model.eval()
    return in_action(task, cfg)


def train_task(cfg) -> dict:
    """Fine-tune / train the config's model into ``<output_dir>/model`` with its task's trainer."""
    spec = task_spec(cfg)
    if spec.train is None:
        raise ValueError(
            f"the {spec.name} task has no trainer: use a trained model (model.pretrained=...) and, in a study, study.train=false"
        )
    return get_method(spec.train)(cfg)
