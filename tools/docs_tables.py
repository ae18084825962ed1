"""Render the tables of docs/results*.md and the README's results from committed results files, and check that they agree.

Each doc of ``DOCS_WITH_TABLES`` holds blocks ``<!-- BEGIN name -->`` ... ``<!-- END name -->``; each is rendered by
``TABLES[name]`` (a renderer of headprune.viz.tables, or tools/readme_results.py for the README's bullets) from the JSON
files in docs/results/. ``python tools/docs_tables.py`` rewrites the blocks; tests/test_results_docs.py
(``make check-results``) fails when they disagree.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

from decode_ideal_table import ideal_table, llm_runs
from long_context_cells import cells_table, curve_table, paired_table, perplexity_paired_table
from long_context_tables import figure as long_context_figure
from long_context_tables import overlap_table, runs_of, within_table
from readme_results import readme_results
from units_table import trained_units_table, units_deploy_table, units_speed_table
from vocab_decode_table import greedy_tokens_per_byte, pareto_tokens_per_byte, per_byte_table
from vocab_table import classifier_vocab_cut_table, vocab_cut_table
from zeroshot_table import table as zeroshot_markdown

from headprune.viz.tables import (
    ablation_table,
    correlation_line,
    cross_file_correlation_line,
    dynamics_table,
    keep_one_table,
    merged_pareto,
    pareto_table,
    prune_table,
    speed_table,
    study_groups_table,
)

BLOCK = re.compile(r"<!-- BEGIN (\w+) -->\n(.*?)<!-- END \1 -->", re.S)
MNLI_STUDY = "mnli_study"  # docs/results/mnli_study.json: ablate (eval + importance), keep_one, prune, speed
MT_STUDY = "mt_study"  # docs/results/mt_study.json: ablate (test + valid), keep_one, prune (orders and groups), speed
PAPER_DYNAMICS = {1: 3.0, 2: 6.2, 3: 18.1, 5: 26.9, 10: 30.6, 20: 34.5, 30: 34.7, 40: 34.9}  # the paper's unpruned BLEU per epoch


def _load(results_dir: Path, name: str) -> dict:
    return json.loads((results_dir / f"{name}.json").read_text())


PARETO_RUNS = {  # prune-for-speed runs (docs/results/<name>.json) merged into one Pareto table and figure per task
    "mnli": ("mnli_pareto_free", "mnli_pareto_lsq", "mnli_pareto_finetune", "mnli_pareto_finetune_long", "mnli_pareto_finetune_44"),
    "mt": ("mt_pareto_free", "mt_pareto_lsq", "mt_pareto_finetune"),
}


def pareto_of(results_dir: Path, task: str) -> dict:
    """The merged Pareto result of one task's committed runs."""
    return merged_pareto(*(_load(results_dir, name) for name in PARETO_RUNS[task]))


def pareto_figures(results_dir: Path) -> list[Path]:
    """docs/results/<task>_pareto.png for every task whose runs are all committed."""
    from headprune.viz.plots import pareto_figure

    made = []
    for task, names in PARETO_RUNS.items():
        if all((results_dir / f"{n}.json").exists() for n in names):
            result = pareto_of(results_dir, task)
            made.append(pareto_figure(result, results_dir / f"{task}_pareto.png", f"{task.upper()}: quality against measured speed-up"))
    return made


TABLES = {
    "mnli_ablation": lambda d: ablation_table(_load(d, MNLI_STUDY)),
    "mnli_ablation_heldout": lambda d: ablation_table(_load(d, MNLI_STUDY), split="importance"),
    "mnli_ablation_full_dev": lambda d: ablation_table(_load(d, "mnli_ablate_full_dev")),
    "mnli_correlation_full_dev": lambda d: cross_file_correlation_line(
        _load(d, "mnli_ablate_full_dev"),
        "eval",
        _load(d, MNLI_STUDY),
        "importance",
        "all 9,815 dev-matched examples vs the 500 held-out training examples",
    ),
    "mnli_correlation": lambda d: correlation_line(_load(d, MNLI_STUDY)),
    "mnli_keep_one": lambda d: keep_one_table(_load(d, MNLI_STUDY)),
    "mnli_prune": lambda d: prune_table(_load(d, MNLI_STUDY)),
    "mnli_prune_full_dev": lambda d: prune_table(_load(d, "mnli_prune_full_dev")),
    "mnli_speed": lambda d: speed_table(_load(d, MNLI_STUDY)),
    "pareto_mnli": lambda d: pareto_table(pareto_of(d, "mnli")),
    "pareto_mt": lambda d: pareto_table(pareto_of(d, "mt")),
    "mt_ablation": lambda d: ablation_table(_load(d, MT_STUDY)),
    "mt_ablation_heldout": lambda d: ablation_table(_load(d, MT_STUDY), split="heldout"),
    "mt_keep_one": lambda d: keep_one_table(_load(d, MT_STUDY)),
    "mt_prune": lambda d: prune_table(_load(d, MT_STUDY), unit="BLEU"),
    "mt_prune_groups": lambda d: study_groups_table(_load(d, MT_STUDY)),
    "mt_correlation": lambda d: correlation_line(_load(d, MT_STUDY)),
    "mt_dynamics": lambda d: dynamics_table(_load(d, "mt_dynamics"), paper=PAPER_DYNAMICS),
}
ONE_RUN_PARETO = {  # block: docs/results/<name>.json of one prune run, rendered as its own Pareto table
    # docs/results.md, section 4: the fine-tuned points beside their controls (full-size bases, and a smaller MiniLM)
    "control_mnli_oneshot": "mnli_control_oneshot",
    "control_mnli_schedule": "mnli_control_schedule",
    "control_mt_schedule": "mt_control_schedule",
    "mnli8k_control_oneshot": "mnli8k_control_oneshot",
    # docs/results_llm.md: SmolLM2 KV groups, in-domain calibration, recovery beside its control
    "lm_recovery_uniform": "lm_recovery_uniform",
    "lm_recovery_uniform_lr5e5": "lm_recovery_uniform_lr5e5",
    "lm_recovery_global": "lm_recovery_global",
    "lm_units_kv_ffn": "lm_units_kv_ffn",  # KV groups and FFN neurons at section 1's FLOPs, and at 80%
    "lm_units_kv_ffn_80": "lm_units_kv_ffn_80",
    "lm_units_kv_ffn_32": "lm_units_kv_ffn_32",  # the same at 92.6% with FFN widths in multiples of 32
    "lm_recovery_global_any_layer": "lm_recovery_global_any_layer",
    "lm_recovery_global_80k": "lm_recovery_global_80k",
    "lm_recovery_global_lora": "lm_recovery_global_lora",
    "lm_recovery_global_fractions": "lm_recovery_global_fractions",
    "llm_reconstruct_75": "llm_reconstruct_75",  # KV groups, FFN neurons and channels at 75% of the FLOPs, reconstructed
    "llm_obs_reconstruct_75": "llm_obs_reconstruct_75",  # KV groups and FFN neurons at 75% chosen by the obs order, reconstructed
    "llm_obs_fisher_reconstruct_75": "llm_obs_fisher_reconstruct_75",  # the same chosen by obs_fisher, reconstructed at ridge 0.01
    "llm_obsf_imp4000_hidden": "llm_obsf_imp4000_hidden",  # KV groups, neurons and channels by obs_fisher on 4,000 texts, reconstructed
    "llm_obsf_imp4000_layer": "llm_obsf_imp4000_layer",  # KV groups, neurons and layers by obs_fisher on 4,000 texts, reconstructed
    "llm_sched_reconstruct_75": "llm_sched_reconstruct_75",  # the same three kinds in two rounds (85%, then 75%), each reconstructed
    "llm_reconstruct_layer_75": "llm_reconstruct_layer_75",  # KV groups, FFN neurons and layers at 75% of the FLOPs, reconstructed
    "llm_reconstruct_75_hidden": "llm_reconstruct_75_hidden",  # residual channels alone at 75% of the FLOPs, reconstructed
    "llm_distill_75": "llm_distill_75",  # the 75%-FLOPs mask reconstructed, then distilled on 100k tokens, beside its control
    "llm_distill_75_kd": "llm_distill_75_kd",  # the Fisher-2000 mask reconstructed, then distilled alone on 200k tokens, beside its control
    "llm_distill_75_kd_obsf": "llm_distill_75_kd_obsf",  # the obs_fisher mask reconstructed, then distilled alone on 200k tokens, beside its control
    "llm_distill_75_kd_obsf_imp4000": "llm_distill_75_kd_obsf_imp4000",  # the same from the mask of 4,000 calibration texts
    "llm_distill_75_kd_obsf_wide": "llm_distill_75_kd_obsf_wide",  # the obs_fisher mask distilled on 350k tokens of data=lm_wide, beside its control
    "llm_distill_75_kd_obsf_wide_ctl": "llm_distill_75_kd_obsf_wide_ctl",  # the same with half the task loss, distilled from the control trained first
    "llm_bytes_vocab_75": "llm_bytes_vocab_75",  # KV groups, FFN neurons and tokens at 75% of the weight bytes, reconstructed
    "llm_bytes_vocab_75_distill": "llm_bytes_vocab_75_distill",  # the same, then fine-tuned on its own split of the text, beside its control
    "llm_vocab16k_distill": "llm_vocab16k_distill",  # the 16,384-token cut, fine-tuned on its own split of the text, beside its control
    "llm_vocab16k_distill_wide": "llm_vocab16k_distill_wide",  # the same cut fine-tuned on 300k tokens of data=lm_wide, beside its control
    "llm_vocab16k_distill_wide600k": "llm_vocab16k_distill_wide600k",  # the same on 600k tokens, bf16-mixed, no control
    "llm_vocab16k_teacher_control20k": "llm_vocab16k_teacher_control20k",  # 20k tokens distilled from the control trained first
    "llm_vocab16k_teacher_unpruned20k": "llm_vocab16k_teacher_unpruned20k",  # the same distilled from the unpruned model
}
TABLES.update({block: (lambda d, name=name: pareto_table(_load(d, name))) for block, name in ONE_RUN_PARETO.items()})
UNIT_RUNS = {  # docs/results.md, section 4: one prune run per unit on the smaller MiniLM (row label: (run, its ONNX model))
    "heads": ("mnli8k_units_head", "heads"),
    "FFN neurons": ("mnli8k_units_ffn", "ffn"),
    "heads + FFN neurons": ("mnli8k_units_joint", "joint"),
}
UNIT_ONNX = ("mnli8k_units_onnx_base", "mnli8k_units_onnx_control", "mnli8k_units_onnx")  # tools/onnx_numbers.py --no-speed


def units_table(results_dir: Path) -> str:
    """The unit runs' recovered points beside their control in PyTorch and ONNX Runtime (tools/units_table.py)."""
    onnx = {"models": {name: model for file in UNIT_ONNX for name, model in _load(results_dir, file)["models"].items()}}
    return units_deploy_table({label: (_load(results_dir, run), name) for label, (run, name) in UNIT_RUNS.items()}, onnx)


TABLES["mnli8k_units"] = units_table
TRAINED_UNIT_RUNS = (  # docs/results.md, section 4: the unit table on the section-1 MiniLM (row label, run file)
    ("heads + FFN neurons, retraining-free", "mnli_units_free_joint"),
    ("heads + FFN neurons, retraining-free", "mnli_units_free_joint_25"),
    ("heads, retraining-free", "mnli_units_free_head"),
    ("FFN neurons, retraining-free", "mnli_units_free_ffn"),
    ("FFN neurons, retraining-free", "mnli_units_free_ffn_25"),
    ("heads + FFN neurons + channels, retraining-free", "mnli_units_free_hidden"),
    ("heads + FFN neurons + channels, retraining-free", "mnli_units_free_hidden_25"),
    ("heads", "mnli_units_head"),
    ("FFN neurons", "mnli_units_ffn"),
    ("FFN neurons", "mnli_units_ffn_25"),
    ("heads + FFN neurons", "mnli_units_joint"),
    ("heads + FFN neurons", "mnli_units_joint_25"),
    ("heads + FFN neurons, 600 steps", "mnli_units_joint_600"),
    ("heads + FFN neurons + channels", "mnli_units_hidden"),
    ("heads + FFN neurons + channels", "mnli_units_hidden_25"),
)
TABLES["units_mnli_trained"] = lambda d: trained_units_table([(label, _load(d, run)) for label, run in TRAINED_UNIT_RUNS])


def committed_runs_table(runs: tuple) -> Callable[[Path], str]:
    """A unit table of the trained MiniLM over ``runs`` ((label, JSON name) pairs), each row whose JSON is committed."""
    return lambda d: trained_units_table([(label, _load(d, run)) for label, run in runs if (d / f"{run}.json").is_file()])


RECONSTRUCT_RUNS = (  # docs/results.md, section 4: compensation on the section-1 MiniLM retrained (73.61%), per-example outcomes kept
    ("heads + FFN neurons, reconstructed", "mnli_units_recon_joint"),
    ("heads + FFN neurons, obs order (bias fixed), reconstructed", "mnli_units_obs_joint"),
    ("heads + FFN neurons, reconstructed, 4x calibration", "mnli_units_recon_joint_cal"),
    ("heads + FFN neurons, reconstructed, ridge 0.1", "mnli_units_recon_joint_r01"),
    ("heads + FFN neurons, reconstructed, ridge 10", "mnli_units_recon_joint_r10"),
    ("heads + FFN neurons, reconstructed towards the teacher's stream", "mnli_units_recon_joint_teacher"),
    ("heads + FFN neurons, the same rearranged mask, no recovery", "mnli_units_mask_joint"),
    ("heads + FFN neurons, reconstructed", "mnli_units_recon_joint_20"),
    ("heads + FFN neurons, obs order (bias fixed), reconstructed", "mnli_units_obs_joint_20"),
    ("heads + FFN neurons, reconstructed, then distilled with layer distillation", "mnli_units_chain_joint"),
    ("heads + FFN neurons, reconstructed, then distilled with layer distillation", "mnli_units_chain_joint_25"),
    ("heads + FFN neurons, reconstructed, then distilled with layer distillation, 600 steps", "mnli_units_chain_joint_600"),
    ("heads + FFN neurons, reconstructed, then distilled with layer distillation, 600 steps", "mnli_units_chain_joint_25_600"),
    ("heads + FFN neurons, reconstructed, then distilled with layer distillation, lr 1e-4", "mnli_units_chain_joint_lr"),
    ("heads + FFN neurons, reconstructed, then distilled with layer distillation x4", "mnli_units_chain_joint_ld"),
    ("heads + FFN neurons, reconstructed, then distilled only (no labels), 600 steps", "mnli_units_chain_joint_kd"),
    ("heads + FFN neurons, reconstructed, then distilled only (no labels), 600 steps", "mnli_units_chain_joint_25_kd"),
    ("heads + FFN neurons, obs order (bias fixed), reconstructed, then distilled only (no labels), 600 steps", "mnli_units_chain_obs_kd"),
    ("heads + FFN neurons, reconstructed, then distilled only (no labels), 1,200 steps", "mnli_units_chain_joint_kd_1200"),
    ("heads + FFN neurons, reconstructed, then distilled only (no labels), 2,400 steps", "mnli_units_chain_joint_kd_2400"),
    ("heads + FFN neurons, reconstructed, then distilled only (no labels), 2,400 steps", "mnli_units_chain_joint_25_kd_2400"),
    ("heads + FFN neurons, reconstructed, then distilled only (no labels), 3,600 steps", "mnli_units_chain_joint_25_kd_3600"),
)
TABLES["units_mnli_reconstruct"] = committed_runs_table(RECONSTRUCT_RUNS)
SCHED_RUN = ("heads + FFN neurons, two rounds, each reconstructed and distilled only, 1,200 steps", "mnli_units_chain_joint_25_kd_sched")
TABLES["units_mnli_sched"] = lambda d: trained_units_table([(SCHED_RUN[0], _load(d, SCHED_RUN[1]))])  # on the MiniLM retrained to 73.60%
LEVER_RUNS = (  # on the same 73.60% MiniLM
    ("heads + FFN neurons + channels, reconstructed", "mnli_units_recon_hidden"),
    ("residual channels alone", "mnli_units_recon_hidden_alone"),
    (
        "heads + FFN neurons, reconstructed, then distilled only (no labels), 2,400 steps, logits alone (no layer loss)",
        "mnli_units_chain_joint_25_kd_2400_ld0",
    ),
    (
        "heads + FFN neurons, obs order (bias fixed) on 2x calibration, reconstructed, then distilled only (no labels), 2,400 steps",
        "mnli_units_chain_obs_25_kd_2400_cal2",
    ),
    ("heads + FFN neurons, reconstructed, then distilled only (no labels), 2,400 steps, lr 1e-4", "mnli_units_chain_joint_25_kd_2400_lr"),
    ("heads + FFN neurons, obs order (bias fixed), reconstructed, 2x calibration", "mnli_units_obs_joint_20_cal2"),
    ("heads + FFN neurons, obs order (bias fixed), reconstructed, 2x calibration", "mnli_units_obs_joint_cal2"),
    (
        "heads + FFN neurons, reconstructed, then distilled only (no labels), 2,400 steps, layer loss x4",
        "mnli_units_chain_joint_25_kd_2400_ld4",
    ),
    (
        "heads + FFN neurons, reconstructed, then distilled only (no labels), 2,400 steps, layer loss per token",
        "mnli_units_chain_joint_25_kd_2400_tok",
    ),
    ("heads + FFN neurons, obs_fisher order (bias fixed), reconstructed", "mnli_units_obsf_joint"),
    ("heads + FFN neurons, obs_fisher order (bias fixed), reconstructed", "mnli_units_obsf_joint_20"),
    ("heads + FFN neurons, obs_fisher order (bias fixed), reconstructed, 4x calibration", "mnli_units_obsf_joint_cal4"),
    ("heads + FFN neurons + channels, obs_fisher order (bias fixed), reconstructed", "mnli_units_obsf_joint_hidden"),
)
TABLES["units_mnli_levers"] = committed_runs_table(LEVER_RUNS)
OBS_BIAS_RUNS = (  # the same obs points with each projection's bias re-solved while pricing (prune.obs_bias=true, the default)
    ("heads + FFN neurons, obs order, reconstructed", "mnli_units_obs_joint_b"),
    ("heads + FFN neurons, obs order, reconstructed, 2x calibration", "mnli_units_obs_joint_cal2_b"),
    ("heads + FFN neurons, obs_fisher order, reconstructed", "mnli_units_obsf_joint_b"),
    ("heads + FFN neurons, obs_fisher order, reconstructed, 4x calibration", "mnli_units_obsf_joint_cal4_b"),
    ("heads + FFN neurons + channels, obs_fisher order, reconstructed", "mnli_units_obsf_joint_hidden_b"),
    ("heads + FFN neurons, obs order, reconstructed", "mnli_units_obs_joint_20_b"),
    ("heads + FFN neurons, obs order, reconstructed, 2x calibration", "mnli_units_obs_joint_20_cal2_b"),
    ("heads + FFN neurons, obs_fisher order, reconstructed", "mnli_units_obsf_joint_20_b"),
)
TABLES["units_mnli_obs_bias"] = committed_runs_table(OBS_BIAS_RUNS)
TOKEN_WEIGHT_RUNS = (  # calibration tokens weighted by the loss gradient at each projection's output: in the fits, in the pricing
    ("heads + FFN neurons, reconstructed", "mnli_units_recon_joint_u"),
    ("heads + FFN neurons, reconstructed on gradient-weighted tokens", "mnli_units_recon_joint_grad"),
    ("heads + FFN neurons, obs_fisher order, reconstructed", "mnli_units_obsf_joint_b"),
    ("heads + FFN neurons, obs_fisher order, reconstructed on gradient-weighted tokens", "mnli_units_obsf_joint_grad"),
    ("heads + FFN neurons, obs_fisher order priced on gradient-weighted tokens, reconstructed", "mnli_units_obsf_joint_tok"),
    ("heads + FFN neurons, obs_fisher order, reconstructed", "mnli_units_obsf_joint_20_b"),
    ("heads + FFN neurons, obs_fisher order priced on gradient-weighted tokens, reconstructed", "mnli_units_obsf_joint_20_tok"),
    (
        "heads + FFN neurons, obs_fisher order priced on gradient-weighted tokens, reconstructed, then distilled only (no labels), 2,400 steps",
        "mnli_units_chain_obsf_tok_25_kd_2400",
    ),
)
TABLES["units_mnli_token_weights"] = committed_runs_table(TOKEN_WEIGHT_RUNS)
TRAINED_ONNX_RUNS = {"FFN neurons": ("mnli_units_ffn", "ffn"), "heads + FFN neurons": ("mnli_units_joint", "joint")}  # x1.8 distilled
TABLES["units_mnli_trained_onnx"] = lambda d: units_deploy_table(
    {label: (_load(d, run), name) for label, (run, name) in TRAINED_ONNX_RUNS.items()}, _load(d, "mnli_units_onnx")
)
TABLES["llm_vocab_cut"] = lambda d: vocab_cut_table(_load(d, "llm_vocab_cut"))  # docs/results_llm.md: SmolLM2's vocabulary cuts
for dtype, suffix in (("f16", ""), ("f32", "_f32")):  # the same llama.cpp generation per byte, f16 and f32 files
    vocab_labels = {f"unpruned {dtype}": f"unpruned, {dtype}", f"vocab 16,384 {dtype}": f"16,384 tokens kept, {dtype}"}
    TABLES[f"llm_vocab_decode{suffix}"] = lambda d, suffix=suffix, labels=vocab_labels: per_byte_table(
        _load(d, f"llm_vocab_llamacpp{suffix}"), greedy_tokens_per_byte(_load(d, "llm_vocab_cut")), labels
    )
for dtype, suffix in (("f16", ""), ("f32", "_f32"), ("f16", "_r120")):  # the bytes-0.75 point; _r120: f16, 120 repeats
    bytes_labels = {
        f"unpruned-deci {dtype}": f"unpruned, as deci, {dtype}",
        f"kv+ffn+vocab@0.75 bytes {dtype}": f"KV groups + neurons + tokens, reconstructed, {dtype}",
    }
    TABLES[f"llm_bytes_vocab_decode{suffix}"] = lambda d, suffix=suffix, labels=bytes_labels: per_byte_table(
        _load(d, f"llm_bytes_vocab_llamacpp{suffix}"),
        pareto_tokens_per_byte(_load(d, "llm_bytes_vocab_75"), "fisher+reconstruct@bytes=0.75"),
        labels,
    )
TABLES["minilm_vocab_freq"] = lambda d: classifier_vocab_cut_table(_load(d, "mnli_vocab_freq"))  # docs/results.md: MiniLM's cuts by use
TABLES["llm_decode_ideal"] = lambda d: ideal_table(d, llm_runs(d))  # docs/results_llm.md: llama.cpp gains beside their ideal
UNIT_SPEED_LABELS = {"unpruned": "unpruned", "heads": "heads", "ffn": "FFN neurons", "joint": "heads + FFN neurons"}
TABLES["mnli8k_units_speed"] = lambda d: units_speed_table(_load(d, "mnli8k_units_speed"), UNIT_SPEED_LABELS)
TRAINED_SPEED_LABELS = {
    "unpruned": "unpruned",
    "heads+ffn x1.5 free": "heads + FFN neurons, retraining-free, x1.5",
    "heads+ffn x1.8 distilled": "heads + FFN neurons, distilled, x1.8",
}
TABLES["units_mnli_trained_speed"] = lambda d: units_speed_table(_load(d, "mnli_units_speed"), TRAINED_SPEED_LABELS)
TRAINED_FFN_SPEED_LABELS = {
    "unpruned": "unpruned",
    "ffn x1.5 free": "FFN neurons, retraining-free, x1.5",
    "ffn x1.8 distilled": "FFN neurons, distilled, x1.8",
}
TABLES["units_mnli_trained_speed_ffn"] = lambda d: units_speed_table(_load(d, "mnli_units_speed_ffn"), TRAINED_FFN_SPEED_LABELS)
TRAINED_25_SPEED_LABELS = {
    "unpruned": "unpruned",
    "heads+ffn x2.5 free": "heads + FFN neurons, retraining-free, x2.5",
    "heads+ffn x2.5 distilled": "heads + FFN neurons, distilled, x2.5",
    "ffn x2.5 distilled": "FFN neurons, distilled, x2.5",
}
TABLES["units_mnli_trained_speed_25"] = lambda d: units_speed_table(_load(d, "mnli_units_speed_25"), TRAINED_25_SPEED_LABELS)
SCHED_SPEED_LABELS = {"unpruned": "unpruned", "heads+ffn x2.5 two rounds": "heads + FFN neurons, two rounds, x2.5"}
TABLES["units_mnli_sched_speed"] = lambda d: units_speed_table(_load(d, "mnli_units_speed_sched"), SCHED_SPEED_LABELS)
OBS20_SPEED_LABELS = {"unpruned": "unpruned", "heads+ffn x2.0 obs free": "heads + FFN neurons, obs order, reconstructed, x2.0"}
TABLES["units_mnli_obs20_speed"] = lambda d: units_speed_table(_load(d, "mnli_units_speed_obs20"), OBS20_SPEED_LABELS)
LONG = ("long_context_passkey", "long_context_perplexity")  # docs/results/<name>_<context length>.json: streaming runs
TABLES["long_context_passkey"] = lambda d: cells_table(runs_of(d, LONG[0]), "passkey")
TABLES["long_context_perplexity"] = lambda d: cells_table(runs_of(d, LONG[1]), "perplexity")
CELLS = ("long_context_cells_passkey", "long_context_cells_perplexity")  # >= 100 prompts, >= 20 documents, per-example values
TABLES["long_context_curve"] = lambda d: curve_table(
    _load(d, "long_context_curve") if (d / "long_context_curve.json").is_file() else None,
    {"the cells below": runs_of(d, CELLS[0]), "the first runs": runs_of(d, LONG[0])},
)
TABLES["long_context_cells_passkey"] = lambda d: cells_table(runs_of(d, CELLS[0]), "passkey")
TABLES["long_context_cells_perplexity"] = lambda d: cells_table(runs_of(d, CELLS[1]), "perplexity")
TABLES["long_context_paired"] = lambda d: paired_table(runs_of(d, CELLS[0]), runs_of(d, CELLS[1]))
TABLES["long_context_paired_perplexity"] = lambda d: perplexity_paired_table(runs_of(d, CELLS[1]))
REPEAT = "long_context_repeat_passkey"  # the repeated-filler haystack (data=passkey_repeat): 100 prompts, per-prompt values
TABLES["long_context_repeat_curve"] = lambda d: curve_table(
    _load(d, "long_context_repeat_curve") if (d / "long_context_repeat_curve.json").is_file() else None,
    {"the cells below": runs_of(d, REPEAT)},
)
TABLES["long_context_repeat_passkey"] = lambda d: cells_table(runs_of(d, REPEAT), "passkey")
TABLES["long_context_repeat_paired"] = lambda d: paired_table(runs_of(d, REPEAT), {})
TABLES["long_context_repeat_vs_unpruned"] = lambda d: paired_table(runs_of(d, REPEAT), {}, reference="unpruned")
TABLES["long_context_within"] = lambda d: within_table(runs_of(d, LONG[0])[4096], runs_of(d, LONG[1]).get(4096))
TABLES["long_context_overlap"] = lambda d: overlap_table(runs_of(d, LONG[0])[1024])


def long_context_figures(results_dir: Path) -> list[Path]:
    """docs/results/long_context.png when the streaming runs are there."""
    passkey = runs_of(results_dir, LONG[0])
    return [long_context_figure(passkey, runs_of(results_dir, LONG[1]), results_dir / "long_context.png")] if passkey else []


ZEROSHOT_RUNS = (
    "llm_zeroshot_75_free",
    "llm_zeroshot_75_distilled",
    "llm_zeroshot_75_free_full",
    "llm_zeroshot_75_distilled_full",
    "llm_zeroshot_75_distilled_obsf",
    "llm_zeroshot_75_distilled_obsf_imp4000",
    "llm_zeroshot_75_distilled_obsf_wide",
    "llm_zeroshot_75_distilled_obsf_wide_ctl",
)  # tools/zeroshot_table.py --out: the same items, paired
TABLES.update({name: (lambda d, name=name: zeroshot_markdown(_load(d, name))) for name in ZEROSHOT_RUNS})
TABLES["readme_results"] = readme_results  # README.md, "Results": one bullet per function of readme_results.BULLETS
DOCS_WITH_TABLES = (  # files whose blocks these renderers write, from the repository root
    "docs/results.md",
    "docs/results_llm.md",
    "docs/results_long_context.md",
    "README.md",
)
ROOT = Path(__file__).resolve().parents[1]


def render_blocks(markdown: str, results_dir: Path) -> str:
    """The markdown with every known block re-rendered from the results files."""

    def replace(match):
        name = match.group(1)
        if name not in TABLES:
            raise KeyError(f"docs block {name!r} has no renderer in tools/docs_tables.py")
        return f"<!-- BEGIN {name} -->\n{TABLES[name](results_dir)}\n<!-- END {name} -->"

    return BLOCK.sub(replace, markdown)


def blocks(markdown: str) -> dict[str, str]:
    """{name: body} of the blocks in a markdown text."""
    return {m.group(1): m.group(2) for m in BLOCK.finditer(markdown)}


def main(argv=None) -> None:
    argv = argv or sys.argv[1:]
    docs = [Path(argv[0])] if argv else [ROOT / name for name in DOCS_WITH_TABLES]
    results_dir = Path(argv[1]) if len(argv) > 1 else ROOT / "docs" / "results"
    for doc in docs:
        doc.write_text(render_blocks(doc.read_text(), results_dir))
        print(f"rendered {len(blocks(doc.read_text()))} blocks of {doc} from {results_dir}")
    print(f"{len(pareto_figures(results_dir))} Pareto figures, {len(long_context_figures(results_dir))} long-context figure")


if __name__ == "__main__":
    main()
