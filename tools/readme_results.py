"""The README's "Results" bullets, rendered from the committed results files (docs/results/*.json).

One function per bullet, each reading its runs with the renderers of the docs' tables (headprune.viz.tables,
tools/units_table.py, tools/decode_ideal_table.py, tools/long_context_cells.py), so a bullet states what a table of
docs/results*.md states. ``BULLETS`` lists them in order; adding a bullet is adding a function there.
tools/docs_tables.py renders the README's ``readme_results`` block with ``readme_results``.
"""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path

from decode_ideal_table import ideal_rows
from long_context_cells import JUDGED_FROM, accuracy_cell, judged, perplexity_rows, ratio_text
from long_context_tables import runs_of
from units_table import gain_cell, interval_text, onnx_accuracies, trained_unit_rows
from vocab_decode_table import pareto_tokens_per_byte, per_byte_gain

from headprune.core.unit_kinds import KINDS, unit_kinds
from headprune.engine.verdict import gain_text
from headprune.results.points import fine_tuned, kinds_label, point_name, units_removed, units_total
from headprune.scoring.paired_outcomes import point_perplexity_ratio
from headprune.viz.tables import kv_cache_kept, prunable_share, stage_of, versus_control, with_control_scores

WIDTH = 118  # the README's line length
ORDER_NAMES = {"duo": "DuoAttention's"}  # how an order is named in prose; others by their own name
LAYOUTS = {"global": "ranked over the whole network", "uniform": "the same number in every layer"}


def _load(results_dir: Path, name: str) -> dict:
    return json.loads((results_dir / f"{name}.json").read_text())


def _points(payload: dict) -> list[dict]:
    """A prune run's points, fine-tuned ones carrying their control's score."""
    return with_control_scores(stage_of(payload, "pareto")["points"])


def _point(payload: dict, name: str, step: str | None = None) -> dict:
    """The one point of a prune run called ``name`` (point_name) at ``step`` (any step when None)."""
    (point,) = [p for p in _points(payload) if point_name(p) == name and step in (None, p["step"])]
    return point


def _tuned(payload: dict) -> list[dict]:
    """A run's fine-tuned points (its control left out)."""
    return [p for p in _points(payload) if fine_tuned(p)]


def _cost(difference: float, unit: str) -> str:
    """``0.72 points`` for a drop, ``a gain of 0.33 points`` for a rise (accuracy, BLEU)."""
    return f"{-difference:.2f} {unit}" if difference <= 0 else f"a gain of {difference:.2f} {unit}"


def _side(difference: float, unit: str) -> str:
    """``0.17 points below`` / ``0.05 points above``."""
    return f"{abs(difference):.2f} {unit} {'below' if difference < 0 else 'above'}"


def _unit_row(payload: dict, name: str, step: str) -> dict:
    """The unit table's row (tools/units_table.py) of one run's point: its difference against the control or the unpruned model."""
    (row,) = [r for r in trained_unit_rows([("run", payload)]) if point_name(r["point"]) == name and r["point"]["step"] == step]
    return row


def _kinds(unit) -> str:
    """``KV groups, neurons and channels``: the kinds of a (joint) unit, in words."""
    nouns = [f"{KINDS[kind].noun}s" for kind in unit_kinds(unit)]
    return nouns[0] if len(nouns) == 1 else f"{', '.join(nouns[:-1])} and {nouns[-1]}"


def heads_alone_and_by_importance(d: Path) -> str:
    """Section 1's trained models; sections 2-3: heads removable alone, and by the importance order within 1 point."""
    mnli = 100 * _load(d, "mnli_finetune")["results"]["eval/accuracy"]
    bleu = _load(d, "mt_train")["results"]["test/bleu"]

    def alone(name: str) -> tuple[int, int, dict]:
        ablation = stage_of(_load(d, name), "ablate")["splits"]["eval"]
        groups = ablation["per_group"].values()
        return sum(g["heads"] - g["significant"] for g in groups), sum(g["heads"] for g in groups), ablation

    def prunable(name: str) -> float:
        stage = stage_of(_load(d, name), "prune")
        return prunable_share(stage["orders"]["importance"]["steps"], 1.0, stage.get("higher_is_better", True))

    (mnli_alone, mnli_heads, mnli_ablation), (mt_alone, mt_heads, mt_ablation) = alone("mnli_ablate_full_dev"), alone("mt_study")
    alphas = " / ".join(sorted({f"{a['bootstrap']['alpha']:g}" for a in (mnli_ablation, mt_ablation)}))
    return (
        f"MiniLM on MNLI {mnli:.2f}% dev-matched, mt_small on Multi30k {bleu:.2f} BLEU: {mnli_alone} of {mnli_heads} MiniLM heads "
        f"(all {mnli_ablation['n_examples']:,} dev-matched examples) and {mt_alone} of {mt_heads} mt_small heads "
        f"({mt_ablation['n_examples']:,} test sentences) can go alone without a significant change "
        f"(p < {alphas}); {prunable('mnli_prune_full_dev'):.0%} (MiniLM) and "
        f"{prunable('mt_study'):.0%} (mt_small) by importance for < 1 point (< 1 BLEU)."
    )


def heads_distilled_beside_control(d: Path) -> str:
    """docs/results.md section 4: fine-tuned head points against the unpruned model given the same fine-tune."""
    mnli = _tuned(_load(d, "mnli_control_oneshot"))
    shown = [
        f"{_cost(p['score'] - p['control_score'], 'points')} (x{p['measured']['speedup']:.2f} faster at batch {p['measured']['batch_size']})"
        for p in mnli
    ]
    mt = max(_tuned(_load(d, "mt_control_schedule")), key=units_removed)
    return (
        "With a distilled fine-tune, against the unpruned model given the same fine-tune (`prune.control=true`): "
        f"{units_removed(mnli[0])} of {units_total(mnli[0])} MiniLM heads go for {shown[0]}"
        + "".join(f" and {units_removed(p)} for {text}" for p, text in zip(mnli[1:], shown[1:]))
        + f"; {units_removed(mt)} of {units_total(mt)} mt_small heads ({mt['step']}) for {_cost(mt['score'] - mt['control_score'], 'BLEU')}."
    )


def smollm2_kv_groups_recovered(d: Path) -> str:
    """docs/results_llm.md section 1: a third of SmolLM2's KV groups, recovered, beside the control."""
    payload = _load(d, "lm_recovery_global")
    prune = payload["config"]["prune"]
    point = _point(payload, "fisher+finetune")
    kept = kv_cache_kept(point, stage_of(payload, "pareto")["unit"])
    return (
        f"SmolLM2-135M ([docs/results_llm.md](docs/results_llm.md)): {units_removed(point)} of its {units_total(point)} KV groups "
        f"({point['order']}, {LAYOUTS[prune['layout']]}) removed and recovered by a distilled fine-tune of "
        f"{prune['finetune']['tokens']:,} tokens: KV cache {1 / kept:.1f}x smaller, perplexity "
        f"{versus_control(point, higher_is_better=False)} from the unpruned model given the same training."
    )


def deployed(d: Path) -> str:
    """docs/results_llm.md section 7 (the global model in llama.cpp) and docs/results.md section 4 (a MiniLM in ONNX int8)."""
    perplexity = _load(d, "llm_llamacpp_perplexity")
    llama_cpp, headprune = perplexity["f32"]["files"]["global"]["perplexity"]["perplexity"], perplexity["headprune"]["global"]
    flash = _load(d, "llm_llamacpp_speed")["flash"]
    kv = {name: flash["files"][name]["kv"]["flash"]["bytes_per_token"] for name in ("unpruned", "global")}
    timed = flash["speed"]["files"]["global"]
    models = _load(d, "mnli8k_deploy_accuracy")["models"]
    throughput = _load(d, "mnli8k_deploy_speed")["throughput"]
    small, large = sorted(throughput, key=int)[0], sorted(throughput, key=int)[-1]
    over_int8 = {size: gain_cell(throughput[size]["h44 onnx int8"]["vs unpruned onnx int8"]) for size in (small, large)}
    int8_drop = onnx_accuracies(models["h44"])[3] - onnx_accuracies(models["control"])[3]
    return (
        f"Deployed: that SmolLM2 as a `deci` GGUF in llama.cpp keeps headprune's perplexity ({llama_cpp:.4f} against "
        f"{headprune:.4f}) and, with flash attention, {1 - kv['global'] / kv['unpruned']:.0%} less KV cache, "
        f"{gain_text(timed['pp']['gain'])} prompt and {gain_text(timed['tg']['gain'])} generation throughput against the "
        f"unpruned GGUF. The smaller MiniLM of docs/results.md section 4, pruned to {models['h44']['heads']} of "
        f"{models['unpruned']['heads']} heads and fine-tuned, runs {over_int8[small]} (batch {small}) and {over_int8[large]} "
        f"(batch {large}) faster in ONNX Runtime int8 than the unpruned model in int8, {_side(int8_drop, 'points')} its "
        "control in int8."
    )


def ffn_neurons_on_trained_minilm(d: Path) -> str:
    """docs/results.md section 4, the unit table on the trained MiniLM: distilled, retraining-free and reconstructed."""
    joint = _load(d, "mnli_units_joint")
    distilled = _unit_row(joint, "fisher+finetune", "speedup=1.8")
    speed = _load(d, "mnli_units_speed")["throughput"]
    sizes = sorted(speed, key=int)
    gains = [gain_cell(speed[size]["heads+ffn x1.8 distilled torch"]["vs unpruned torch"]) for size in sizes]
    free = _unit_row(_load(d, "mnli_units_free_joint"), "fisher+rearrange+lsq", "speedup=1.5")
    recon_run = _load(d, "mnli_units_recon_joint")
    recon = _unit_row(recon_run, "fisher+rearrange+reconstruct", "speedup=1.5")
    surgeon_run = _load(d, "mnli_units_obsf_joint_tok")  # the loss-weighted surgeon, each bias re-solved, tokens weighted by the loss
    surgeon = _unit_row(surgeon_run, "obs_fisher+reconstruct", "speedup=1.5")
    results = joint["results"]
    return (
        f"FFN neurons beside heads on the trained MiniLM ({results['base_score']:.2f}% on all {results['n_examples']:,} "
        "dev-matched; docs/results.md, section 4): heads and neurons ranked together and distilled to "
        f"x{distilled['point']['predicted_speedup']:.1f} FLOP-ideal run {' / '.join(gains)} faster in PyTorch at batch "
        f"{' / '.join(sizes)}, {interval_text(distilled['difference'])} points against the {distilled['against']} "
        f"(unpaired); retraining-free at x{free['point']['predicted_speedup']:.1f}, `{point_name(free['point'])}` "
        f"{interval_text(free['difference'])} against the {free['against']} model, and layer-wise reconstruction "
        f"(`prune.recover=reconstruct`, on the model retrained to {recon_run['results']['base_score']:.2f}%) "
        f"{interval_text(recon['difference'])} against the {recon['against']} model ({'paired' if recon['difference']['paired'] else 'unpaired'}), "
        f"with the units ranked by `prune.order=obs_fisher` priced on loss-weighted tokens (`prune.obs_tokens=gradient`, on the "
        f"model retrained to {surgeon_run['results']['base_score']:.2f}%) {interval_text(surgeon['difference'])}."
    )


def reconstructed_then_distilled(d: Path) -> str:
    """docs/results.md section 4: reconstruction, then a distilled fine-tune with layer distillation, against its control."""
    runs = [("x1.8", _load(d, "mnli_units_chain_joint")), ("x2.5", _load(d, "mnli_units_chain_joint_25"))]
    rows = [r for r in trained_unit_rows(runs) if not r["point"].get("control")]
    control = next(p for p in _points(runs[0][1]) if p.get("control"))
    alone = [_load(d, "mnli_units_joint"), _load(d, "mnli_units_joint_25")]  # the fine-tune alone, on the 73.57% model
    lost = [
        f"{-r['difference']['difference']:.2f}"
        for r in trained_unit_rows([("x1.8", alone[0]), ("x2.5", alone[1])])
        if not r["point"].get("control") and r["against"] == "control"
    ]
    said = " and ".join(
        f"x{r['point']['predicted_speedup']:.1f} {interval_text(r['difference'])}"
        for r in sorted(rows, key=lambda r: r["point"]["predicted_speedup"])
    )
    distilled = [("x1.8", _load(d, "mnli_units_chain_joint_kd")), ("x2.5", _load(d, "mnli_units_chain_joint_25_kd"))]
    only = [r for r in trained_unit_rows(distilled) if not r["point"].get("control")]
    only_said = " and ".join(f"x{r['point']['predicted_speedup']:.1f} {interval_text(r['difference'])}" for r in only)
    only_control = next(p for p in _points(distilled[0][1]) if p.get("control"))
    longer = [r for run in ("1200", "2400") for r in trained_unit_rows([("x1.8", _load(d, f"mnli_units_chain_joint_kd_{run}"))])]
    longer = [r for r in longer if not r["point"].get("control")]
    (longer25,) = [r for r in trained_unit_rows([("x2.5", _load(d, "mnli_units_chain_joint_25_kd_2400"))]) if not r["point"].get("control")]
    tokens25 = ("x2.5", _load(d, "mnli_units_chain_obsf_tok_25_kd_2400"))  # units priced by obs_fisher on loss-weighted tokens
    (priced25,) = [r for r in trained_unit_rows([tokens25]) if not r["point"].get("control")]
    return (
        "Reconstructed, then distilled with CoFi's layer loss beside the logits (`prune.recover=reconstruct+finetune`, "
        f"`prune.finetune.layer_distill=1.0`, 200 steps), heads and neurons of the same MiniLM: {said} points against "
        f"the control ({control['score']:.2f}%, paired), where the fine-tune alone lost {' and '.join(lost)}; "
        f"distilled without labels (`prune.finetune.distill_weight=1.0`, 600 steps): {only_said} against its control "
        f"({only_control['score']:.2f}%, paired); with 1,200 and 2,400 steps, x1.8 "
        f"{' and '.join(interval_text(r['difference']) for r in longer)}, and with 2,400 steps x2.5 "
        f"{interval_text(longer25['difference'])} ({interval_text(priced25['difference'])} from units ranked by `prune.order=obs_fisher` "
        f"with `prune.obs_tokens=gradient`), against the {longer[0]['against']} model (paired)."
    )


def smollm2_reconstructed(d: Path) -> str:
    """docs/results_llm.md section 9: layer-wise reconstruction without training."""
    payload = _load(d, "llm_reconstruct_75")
    base = stage_of(payload, "pareto")["base_score"]
    masked, rebuilt = _point(payload, "fisher"), _point(payload, "fisher+reconstruct")
    unit = stage_of(payload, "pareto")["unit"]
    wider = _point(_load(d, "llm_reconstruct_75_fisher2000"), "fisher+reconstruct")
    best, surgeon = _load(d, "llm_reconstruct_75_fisher2000_r001_cal2000"), _load(d, "llm_obsf_imp4000_hidden")
    chosen = _point(surgeon, "obs_fisher+reconstruct")
    surgeon_texts = surgeon["config"]["data"]["limits"]["importance"]
    ridge, texts = best["config"]["prune"]["reconstruct"]["ridge"], best["config"]["prune"]["recover_examples"]
    return (
        f"SmolLM2 with {_kinds(unit)} ranked together to {masked['flops_kept']:.0%} of the FLOPs ({kinds_label(masked['mask'], unit)} "
        f"removed), retraining-free: layer-wise reconstruction takes perplexity from {masked['score'] / base:.2f}x to "
        f"{rebuilt['score'] / base:.2f}x the unpruned model's, {wider['score'] / base:.2f}x with Fisher scores on 2,000 texts, "
        f"{_point(best, 'fisher+reconstruct')['score'] / base:.2f}x with a ridge of {ridge:g} (`prune.reconstruct.ridge`) on "
        f"{texts:,} calibration texts, and {chosen['score'] / base:.2f}x with the same kinds ranked by `prune.order=obs_fisher` on "
        f"{surgeon_texts:,} texts ({kinds_label(chosen['mask'], stage_of(surgeon, 'pareto')['unit'])} removed; each unit's output "
        "error after the optimal update of the rest, a channel's summed over every projection reading the stream, weighted by "
        "its squared loss gradient; docs/results_llm.md section 9)."
    )


def smollm2_distilled(d: Path) -> str:
    """docs/results_llm.md section 9: the obs_fisher mask distilled with half the task loss from the control trained first."""
    payload = _load(d, "llm_distill_75_kd_obsf_wide_ctl")
    base, control = _point(payload, "unpruned"), next(p for p in _points(payload) if p.get("control"))
    point = next(p for p in _tuned(payload) if not p.get("control"))

    def ratio(a: dict, b: dict) -> str:  # a's perplexity over b's on the same texts, with its paired bootstrap interval
        r = point_perplexity_ratio(a, b)
        return f"{r['ratio']:.3f} [{r['low']:.3f}, {r['high']:.3f}]"

    settings, unit = payload["config"]["prune"]["finetune"], stage_of(payload, "pareto")["unit"]
    return (
        f"SmolLM2 with {_kinds(unit)} ranked by `obs_fisher` to {point['flops_kept']:.0%} of the FLOPs "
        f"({kinds_label(point['mask'], unit)} removed), reconstructed, then "
        f"distilled on {point['finetune_tokens']:,} tokens with {1 - settings['distill_weight']:.0%} of the loss on "
        f"the text (`prune.finetune.distill_weight={settings['distill_weight']:g}`) from its control trained first "
        f"(`prune.finetune.teacher={settings['teacher']}`): perplexity {point['score']:.2f}, {ratio(point, base)} of the unpruned "
        f"model's {base['score']:.2f}, but its control learns the text faster ({control['score']:.2f}), so it stays "
        f"{ratio(point, control)} of the control's (docs/results_llm.md section 9)."
    )


def ffn_widths_of_32_in_llama_cpp(d: Path) -> str:
    """docs/results_llm.md section 8: KV groups and FFN neurons in multiples of 32, and their llama.cpp generation gain."""
    payload = _load(d, "lm_units_kv_ffn_32")
    multiple = payload["config"]["prune"]["ffn_multiple"]
    joint, kv_only = _point(payload, "fisher+finetune"), _point(_load(d, "lm_recovery_global"), "fisher+finetune")
    recheck = _load(d, "llm_units_llamacpp_recheck")["q8_0"]["speed"]
    (row,) = [r for r in ideal_rows(d, recheck) if r["file"] == "kv+ffn@0.926/32 q8_0" and r["reference"] == "unpruned-deci q8_0"]
    return (
        f"SmolLM2, KV groups and FFN neurons pruned to the KV-only model's {kv_only['flops_kept']:.1%} of the FLOPs, widths then "
        f"rounded up to multiples of {multiple} ({joint['flops_kept']:.1%} kept; `prune.ffn_multiple={multiple}`, docs/results_llm.md "
        f"section 8): perplexity {joint['score']:.2f} against the KV-only "
        f"{kv_only['score']:.2f}; its generation in llama.cpp can gain at most {100 * row['ideal']:+.1f}% (the bytes a token "
        "reads), and measured again beside the unpruned model written in the same graph its Q8_0 file's generation gain is "
        f"{gain_text(row['gain'])}."
    )


def vocabulary_under_a_bytes_budget(d: Path) -> str:
    """docs/results_llm.md section 11: tokens beside KV groups and neurons under one bytes budget, decoded in llama.cpp."""
    payload = _load(d, "llm_bytes_vocab_75")
    unit = stage_of(payload, "pareto")["unit"]
    base, point = _point(payload, "unpruned"), _point(payload, "fisher+reconstruct")
    unpruned_tpb, cut_tpb = pareto_tokens_per_byte(payload, "fisher+reconstruct@bytes=0.75")
    speed = _load(d, "llm_bytes_vocab_llamacpp_r120")["speed"]
    per_byte, ideal = per_byte_gain(speed["files"]["kv+ffn+vocab@0.75 bytes f16"]["tg"], unpruned_tpb / cut_tpb)
    return (
        f"The vocabulary as a unit: SmolLM2's {_kinds(unit)} under one budget of the weight bytes a decoded token reads "
        f"(`'prune.target={{bytes:0.75}}'`, {kinds_label(point['mask'], unit)} removed), reconstructed: "
        f"{point['bits_per_byte'] / base['bits_per_byte'] - 1:+.1%} bits per byte of text; its `deci` GGUF generates "
        f"{gain_text(per_byte)} more bytes of text per second in llama.cpp (f16, {speed['repeats']} repeats; bandwidth-ideal "
        f"{100 * ideal:+.1f}%; docs/results_llm.md section 11)."
    )


def vocabulary_cut_fine_tuned(d: Path) -> str:
    """docs/results_llm.md section 11: the vocabulary alone cut to 16,384 tokens, fine-tuned on the most text, per byte."""
    payload = _load(d, "llm_vocab16k_distill_wide600k")
    base, (point,) = _point(payload, "unpruned"), _tuned(payload)
    keeps = point["mask"]["vocab"][0]  # 1 = the token stays
    removed = len(keeps) - int(sum(keeps))
    tokens = point["finetune_tokens"]
    return (
        f"SmolLM2's vocabulary alone cut by {removed:,} tokens to {len(keeps) - removed:,} (the rewritten "
        f"tokenizer with it), then fine-tuned on {tokens:,} tokens of its own split of the text: "
        f"{point['bits_per_byte'] / base['bits_per_byte'] - 1:+.2%} bits per byte over the unpruned model (the paired "
        f"interval holds +2%; docs/results_llm.md section 11)."
    )


def streaming(d: Path) -> str:
    """docs/results_long_context.md: the unpruned model's retrieval at 1k tokens and one streamed cell on 100 prompts."""
    passkey_runs = runs_of(d, "long_context_cells_passkey")
    length = min(passkey_runs)
    passkey = passkey_runs[length]
    stream = _load(d, f"long_context_cells_passkey_{length}")["config"]["prune"]["stream"]
    (order,) = passkey["orders"]
    step = max(passkey["orders"][order]["steps"], key=lambda s: s["fraction"])
    n = int(passkey["n_examples"])
    perplexity = runs_of(d, "long_context_cells_perplexity")
    (ratio,) = [
        r["ratio"]
        for r in perplexity_rows(perplexity, reference="unpruned")
        if (r["length"], r["order"]) == (length, order) and abs(r["fraction"] - step["fraction"]) < 1e-9
    ]
    bar = "at or above" if judged(passkey) else "below"
    return (
        "Streaming ([docs/results_long_context.md](docs/results_long_context.md)): KV groups streamed to a "
        f"{stream['sink']}-token sink and a {stream['window']}-token window. On {n} prompts the unpruned SmolLM2 retrieves "
        f"{accuracy_cell(float(passkey['base_score']), n)} (%) of the keys at {length:,} tokens, {bar} the {JUDGED_FROM:.0f}% "
        f"from which an order's cost can be judged; with {step['fraction']:.0%} of its KV groups streamed by "
        f"{ORDER_NAMES.get(order, order)} order ({step['kv_fraction']:.0%} of the cache) it retrieves "
        f"{accuracy_cell(step['score'], n)} (%), perplexity {ratio_text(ratio)} on {int(perplexity[length]['n_examples'])} documents."
    )


BULLETS = (
    heads_alone_and_by_importance,
    heads_distilled_beside_control,
    smollm2_kv_groups_recovered,
    deployed,
    ffn_neurons_on_trained_minilm,
    reconstructed_then_distilled,
    smollm2_reconstructed,
    smollm2_distilled,
    ffn_widths_of_32_in_llama_cpp,
    vocabulary_under_a_bytes_budget,
    vocabulary_cut_fine_tuned,
    streaming,
)


LIST_MARKER = re.compile(r"^\s*([-+*]|\d+[.)])(\s|$)")  # a line markdown would read as a new list item


def bullet(text: str) -> str:
    """A markdown list item wrapped to the README's width, continuation lines indented under it (none starting a new item)."""
    lines = textwrap.wrap(text, WIDTH, initial_indent="- ", subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
    if any(LIST_MARKER.match(line) for line in lines[1:]):
        raise ValueError(f"a wrapped line of this bullet reads as a list item; reword it: {text[:60]}...")
    return "\n".join(lines)


def readme_results(results_dir: Path) -> str:
    """The README's results bullets, one per function of ``BULLETS``."""
    return "\n".join(bullet(render(results_dir)) for render in BULLETS)
