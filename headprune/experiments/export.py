"""experiment=export: write a pruned model as a stock HF checkpoint, ONNX (optionally int8) or GGUF, and check it with stock libraries."""

import copy
import json
from pathlib import Path

from omegaconf import OmegaConf, open_dict

from headprune.checks.shared_checks import check_exact_pruning, check_model_and_task, check_splits, refuse_given, task_spec_of
from headprune.core.checks import ConfigError
from headprune.core.ffn.pruning import ffn_record
from headprune.core.kinds import KINDS, kinds_of
from headprune.core.pruning import pruning_record
from headprune.core.record_digests import RECORD_FILE
from headprune.core.unit_kinds import kind_of_group, noun
from headprune.core.units import model_gates
from headprune.export import FORMATS, export_model
from headprune.export.client_check import CLIENTS, checked_in_client
from headprune.export.gguf_pre import choose_tokenizer_pre
from headprune.export.record import console_lines, is_pruned, layer_widths, removed_units, tensor_parallel
from headprune.export.renumbering import renumbering
from headprune.export.verify import check_export, check_fields, check_line, pruned_copy, reference_outputs, refusal_message, sample_texts
from headprune.measures.evaluation import check_split, swapped_model
from headprune.models.sources import check_model_dir, config_fields
from headprune.results.run_dir import mask_to_json, write_results
from headprune.results.writer import fresh_dir, output_dir, read_json, replace_dir
from headprune.sources.mask_source import chosen_mask, file_mask, pick_keys, point_model_dir, with_file_unit
from headprune.tasks import registry
from headprune.tasks.unit_task import unit_of

EXPORT_DIR = "export"  # <run>/export/<format>/
STAGING = ".export.next"  # where an export is written and checked before it replaces <run>/export


# ---- checks before any work --------------------------------------------------------------------


def with_source_model(cfg):
    """``cfg`` with ``model.pretrained`` (and its tokenizer) pointing at ``export.model`` when that is set."""
    source = point_model_dir(cfg.export, "export", need_model=True) or cfg.export.get("model")
    if not source:
        return cfg
    cfg = copy.deepcopy(cfg)
    with open_dict(cfg):
        cfg.model.pretrained = str(source)
        cfg.model.tokenizer = str(source)
        cfg.model.config = None
    return cfg


def source_rows(cfg, fields: dict) -> dict[str, list[list[int]]]:
    """The query-head mask {group: [layers][heads]} the export will apply (mask file), or the saved model's pruning record."""
    settings = cfg.export
    folder = point_model_dir(settings, "export", need_model=True) or settings.get("model")
    if folder:
        record = read_json(Path(str(folder)) / "config.json").get("headprune_pruned_heads") or {}
        layers, heads = int(fields["num_hidden_layers"]), int(fields["num_attention_heads"])
        return {
            group: [[0 if h in set(removed.get(str(layer), [])) else 1 for h in range(heads)] for layer in range(layers)]
            for group, removed in (record or {"dec_self": {}}).items()
        }
    found, chosen = chosen_mask(settings, "export")
    unit = found.unit or unit_of(cfg)
    rows = {g: kind_of_group(g, unit).query_head_rows(r, fields) for g, r in chosen.mask.items()}
    return {g: r for g, r in rows.items() if r is not None}  # the attention part, over query heads


def check(cfg) -> None:
    """experiment=export: the model and task, every export.* setting, the mask source and the format's demands, before any work."""
    check_model_and_task(cfg)
    mask_file = cfg.export.get("mask_file")
    readable = mask_file and Path(str(mask_file)).expanduser().is_file()  # a missing one is told by check_settings
    kinds = kinds_of(unit_of(with_file_unit(cfg, "export"))) if readable else None  # None: any kind (refused where inexact)
    check_exact_pruning(cfg, "the export writes the model pruned by export.mask_file" if mask_file else None, kinds)
    spec, fmt = task_spec_of(cfg), cfg.export.get("format")  # what the task's models take (TaskSpec.exports)
    if fmt in FORMATS and FORMATS[fmt].family_refusal and fmt not in spec.exports:  # stock checkpoints of decoder-only LMs
        raise ConfigError(FORMATS[fmt].family_refusal({"model_type": f"{cfg.model.get('name')} ({spec.name} task)"}))
    if str(cfg.export.quantize) == "int8" and "int8" not in spec.exports:  # int8 where the metric runs in ONNX Runtime
        raise ConfigError(
            f"export.quantize=int8 is checked by the task's metric through ONNX Runtime, where the {spec.name} task's metric "
            "cannot run (BLEU needs beam search, which the cache-free ONNX graphs of seq2seq models do not run): "
            "export in f32 (export.quantize=none)"
        )
    check_settings(cfg, kinds)
    check_splits(cfg, [cfg.export.split], "export.split")


def check_settings(cfg, kinds) -> None:
    """Every export.* setting, the mask source and the format's demands on the model (``kinds``: those of the mask file's unit)."""
    settings = cfg.export
    fmt, quantize = str(settings.format), str(settings.quantize)  # their choices: the schema's (ExportSettings)
    if settings.get("model"):
        refuse_given(cfg, pick_keys("export"), f"export.model={settings.model} is exported as it is (they pick a mask of export.mask_file)")
    if settings.get("point"):
        refuse_given(cfg, pick_keys("export"), f"export.point={settings.point} names the point itself")
    for other, record in FORMATS.items():  # settings another format reads (quantize, per_channel: checked below)
        foreign = tuple(f"export.{r}" for r in record.reads if r not in FORMATS[fmt].reads and r not in ("quantize", "per_channel"))
        if foreign:
            refuse_given(cfg, foreign, f"they shape {other.upper()} files, and export.format={fmt}")
    if quantize != "int8":
        refuse_given(cfg, ("export.per_channel", "export.int8_batch_sizes"), "they set the int8 graphs of export.quantize=int8 only")
    if fmt not in CLIENTS:
        refuse_given(cfg, ("export.client_check",), f"it runs {' and '.join(CLIENTS)} exports in their client, and export.format={fmt}")
    if bool(settings.get("mask_file")) == bool(settings.get("model")):
        raise ConfigError(
            "give one source of the pruned model: export.mask_file=<prune run>/results.json (with export.mask_order, "
            "export.mask_step or export.fraction) or export.model=<dir written by headprune.save_pruned>"
        )
    check_source(cfg)
    if not settings.get("mask_file"):  # every kind the pruned model lost units of can be exported
        record = Path(str(settings.model)).expanduser() / RECORD_FILE
        saved = (read_json(record) if record.is_file() else {}).get("kinds") or {}  # format 2: {kind name: its entries}
        kinds = [KINDS[name] for name in saved if name in KINDS]
    refused = next(((kind, why) for kind in kinds if (why := kind.export_refusal(fmt))), None)
    if refused is not None:
        raise ConfigError(f"experiment=export of a model pruned by {refused[0].name}: {refused[1]}")
    renumbered_by = next((kind for kind in kinds if kind.renumbers_ids and settings.get("mask_file")), None)  # a saved one: renumbered
    if renumbered_by is not None and quantize != "none":  # the int8 score feeds the graphs the task's own ids
        raise ConfigError(
            f"export.quantize={quantize} scores the graphs with the task's own token ids, and a model pruned by "
            f"{renumbered_by.name} ships renumbered ids with its rewritten tokenizer: export in f32 (export.quantize=none)"
        )
    if quantize not in FORMATS[fmt].quantize:
        raise ConfigError(
            f"export.quantize={quantize} quantises ONNX graphs (ONNX Runtime's quantize_dynamic): use export.format=onnx, not {fmt}"
        )
    if FORMATS[fmt].decoder_only:  # what the format demands of the model and of the mask, else a ConfigError naming what works
        fields = config_fields(with_source_model(cfg).model) or {}
        why = FORMATS[fmt].family_refusal(fields) if FORMATS[fmt].family_refusal else None
        if why:
            raise ConfigError(why)
        if FORMATS[fmt].check_mask:
            FORMATS[fmt].check_mask(fields, source_rows(cfg, fields))
    if "tokenizer_pre" in FORMATS[fmt].reads:
        choose_tokenizer_pre(settings, with_source_model(cfg).model)  # a tokenizer no llama.cpp name fits: refused now


def check_source(cfg) -> None:
    """The pruned model's source: a mask of ``export.mask_file`` (a point of it) or an ``export.model`` directory."""
    settings = cfg.export
    if settings.get("mask_file"):
        if settings.get("fraction") is not None and float(settings.fraction) == 0:
            raise ConfigError(
                f"export.fraction=0 prunes no {noun(unit_of(with_file_unit(cfg, 'export')))}: the export would be the unpruned model "
                "(as speed.fraction=0 is refused); "
                "pick a step that removes some, or leave export.fraction out when the file holds one"
            )
        if settings.get("point"):
            point_model_dir(settings, "export", need_model=True)  # a point of the file (the error lists them) with a saved model
        else:
            chosen_mask(settings, "export")  # one candidate, or the list to pick from
    elif settings.get("point"):
        raise ConfigError("export.point names a point of a prune run: give export.mask_file=<prune run>/results.json, not export.model")
    else:
        path = Path(str(settings.model)).expanduser()
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"export.model={settings.model} is no model directory (no config.json): give a directory written by "
                "headprune.save_pruned (or a task's save_hf)"
            )
        try:
            check_model_dir(path, "export.model")
        except FileNotFoundError as err:
            raise ConfigError(str(err)) from None
        # a model of the kind the task serves (a Llama directory is no model=tiny_bert classifier)
        registry.check_model_dir_kind(read_json(path / "config.json"), cfg, f"export.model={settings.model}")


# ---- the run ------------------------------------------------------------------------------------


def export_source(cfg, task) -> tuple[dict | None, dict]:
    """(the mask in the task's unit, or None for a saved pruned model; where the pruned model came from)."""
    settings = cfg.export
    if settings.get("point"):  # the point's saved model itself (check_source refused a point without one)
        folder = point_model_dir(settings, "export", need_model=True)
        return None, {
            "point": str(settings.point),
            "model": str(folder),
            "mask_file": str(settings.mask_file),
            "pruning_record": pruning_record(task.model),
        }
    if settings.get("mask_file"):
        return file_mask(settings, task, "export")
    record = pruning_record(task.model)
    if not is_pruned(task.model):
        print(
            f"[export] export.model={settings.model} holds no removed unit of any kind: it is exported, and recorded, as unpruned",
            flush=True,
        )
    return None, {"model": str(settings.model), "pruning_record": record, "pruned": is_pruned(task.model)}


def quantized_record(task, graphs: dict, config, out: Path, mask, settings) -> dict:
    """Quantise the ONNX graphs to int8; score both exports in ONNX Runtime at the task's batching and at each of ``export.int8_batch_sizes``, beside the masked model's score; the summary printed."""
    from headprune.export.onnx import quantize_int8
    from headprune.export.runtime import OnnxRuntimeModel

    split, per_channel = str(settings.split), bool(settings.per_channel)
    masked_score = task.evaluate(mask, split=split).score
    exports = {"f32": graphs, "int8": quantize_int8(graphs, out / "int8", per_channel)}
    scores, spreads = {}, {}
    for name, files in exports.items():
        with swapped_model(task, OnnxRuntimeModel(files, config, main_input_name=task.model.main_input_name), task.gates):
            scores[name] = task.evaluate(None, split=split).score
            sizes = sorted({int(b) for b in settings.int8_batch_sizes})
            values = [float(task.evaluate(None, split=split, batch_size=b).score) for b in sizes]  # one score per batch size
            spreads[name] = {"batch_sizes": sizes, "scores": values, "min": min(values), "max": max(values)}
            spreads[name]["spread"] = max(values) - min(values)
    q = {
        "metric": task.metric,
        "split": split,
        "masked_torch": masked_score,
        "onnx_f32": scores["f32"],
        "onnx_int8": scores["int8"],
        "int8_minus_f32": scores["int8"] - scores["f32"],
        "by_batch_size": spreads,  # {"f32" | "int8": {"batch_sizes", "scores", "min", "max", "spread"}}
        "per_channel": per_channel,
        "files": sorted(str(p.relative_to(out)) for p in (out / "int8").iterdir() if p.is_file()),
        "bytes": {name: sum(Path(p).stat().st_size for p in files.values()) for name, files in exports.items()},
    }
    print(
        f"[export] {q['metric']} on {split}: masked {masked_score:.4g}, ONNX f32 {q['onnx_f32']:.4g}, ONNX int8 {q['onnx_int8']:.4g}; "
        + "; ".join(spread_line(f"ONNX {name}", q["by_batch_size"][name]) for name in ("int8", "f32")),
        flush=True,
    )
    return q


def export_record(task, pruned, mask, exported: dict, staging: Path, report: dict, batches: list, settings) -> dict:
    """What results.json says of an export: its files, the model it holds (pruned or not, its heads) and the check."""
    reads = FORMATS[str(settings.format)].reads
    shapes = sorted({(len(s.head_ids), len(s.kv_ids)) for s in model_gates(pruned).sites})
    widths = layer_widths(pruned)
    return {
        "format": str(settings.format),
        "files": [str(Path(EXPORT_DIR) / Path(p).relative_to(staging)) for p in exported["files"]],
        "bytes": sum(Path(p).stat().st_size for p in exported["files"]),
        "mask": None if mask is None else mask_to_json(mask),
        "unit": task.gates.unit,
        "pruned": is_pruned(pruned),  # units of any kind; an unpruned directory is exported, and recorded, as what it is
        "removed_units": removed_units(pruned),  # {record key: units removed}, each kind's own count
        "model_type": pruned.config.model_type,
        "architecture": type(pruned).__name__,
        "pruning_record": pruning_record(pruned),
        "ffn_pruning_record": ffn_record(pruned) if any(w["ffn"] is not None for w in widths) else {},
        "heads_per_layer": [list(s) for s in shapes],
        "widths_per_layer": widths,  # kept query heads, KV heads, FFN neurons of each layer
        "tensor_parallel": tensor_parallel(exported.get("layout") or widths),  # of the layers as the file holds them
        "padded_query_heads": exported.get("padded_query_heads"),  # deci_hf: zero query heads written back per layer
        "placeholder_layers": exported.get("placeholder_layers"),
        "gguf_dtype": str(settings.gguf_dtype) if "gguf_dtype" in reads else None,
        "check": report,
        "check_examples": sum(int(b["input_ids"].shape[0]) for b in batches),
    }


def run(cfg) -> dict:
    """Prune, export, check in a fresh interpreter; only a file that passes moves into export/, then results.json is written."""
    cfg = with_file_unit(with_source_model(cfg), "export")  # a mask file says its own unit (head or kv_group)
    settings = cfg.export
    fmt, split = str(settings.format), str(settings.split)
    pre = choose_tokenizer_pre(settings, cfg.model) if "tokenizer_pre" in FORMATS[fmt].reads else None
    dtype = str(settings.gguf_dtype) if "gguf_dtype" in FORMATS[fmt].reads else "f32"  # the precision of the file written
    task = registry.load_task(cfg)
    check_split(task, split)
    mask, origin = export_source(cfg, task)
    batches = [
        {k: v.cpu() for k, v in b.items()}
        for b in task.timing_batches(int(settings.batch_size), int(settings.examples), split, seed=int(cfg.seed))
    ]
    pruned = pruned_copy(task, mask)
    ids = renumbering(pruned, task.tokenizer)  # a kind that renumbers token ids (vocab) ships its rewritten tokenizer
    batches, export_batches, texts = ids.batches(task.tokenizer, batches)
    reference = reference_outputs(task, pruned, mask, batches, settings, suppress=ids.removed)
    ids.apply(pruned)  # from here the copy speaks the files' ids
    staging = fresh_dir(output_dir(cfg) / STAGING)  # the previous export stays whole until this one is checked
    out = staging / fmt
    name = f"{cfg.model.get('name')}-pruned" if is_pruned(pruned) else str(cfg.model.get("name"))  # unpruned: as it is
    exported = export_model(fmt, pruned, ids.tokenizer, out, export_batches[0], str(settings.gguf_dtype), name, pre and pre["name"])
    print(
        f"[export] {fmt}: {len(exported['files'])} files written aside in {out}; checking in a fresh interpreter without headprune",
        flush=True,
    )
    job = {**exported["job"], **sample_texts(ids.tokenizer, export_batches), **check_fields(pruned, reference, pre)}
    report = check_export(job, export_batches, ids.logits(reference.logits), ids.greedy(reference.greedy), float(settings.tolerance))
    report.update(texts)
    result = export_record(task, pruned, mask, exported, staging, report, batches, settings)
    if pre is not None:
        result["tokenizer_pre"] = pre
    if reference.masked_logits is not None:  # f16 GGUF: how far its rounded weights move the logits from the masked f32 model
        result["f16_vs_masked_max_abs_diff"] = max(float(abs(m - r).max()) for m, r in zip(reference.masked_logits, reference.logits))
    print(check_line(report), flush=True)
    for line in console_lines(result):
        print(line, flush=True)
    if not report["passed"]:
        (staging / "check.json").write_text(json.dumps(report, indent=1, default=str))
        raise ValueError(refusal_message(fmt, report, staging))
    if bool(settings.client_check):
        result["client_check"] = checked_in_client(task, mask, reference, fmt, dtype, out, staging, ids)  # a refusal raises
    if str(settings.quantize) == "int8":
        result["quantized"] = quantized_record(task, exported["graphs"], pruned.config, out, mask, settings)
    replace_dir(staging, output_dir(cfg) / EXPORT_DIR)  # every file of the previous export goes (an int8 graph too)
    write_results(  # last: results.json never describes files that are not there
        cfg, "export", result, task, split, inputs={**origin, "format": fmt, "settings": OmegaConf.to_container(settings, resolve=True)}
    )
    return {"objective": report["max_abs_diff"], **result}


def spread_line(name: str, record: dict) -> str:
    """``name`` at each batch size and the spread, for the printed summary."""
    each = ", ".join(f"{b}: {s:.4g}" for b, s in zip(record["batch_sizes"], record["scores"]))
    return f"{name} at batch {each} (min {record['min']:.4g}, max {record['max']:.4g}, spread {record['spread']:.3g})"
