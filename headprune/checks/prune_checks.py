"""Checks of the prune.* settings shared by prune and the study: each rule a ConfigError naming the setting, the fault and the fix."""

from importlib.util import find_spec

from omegaconf import OmegaConf

from headprune.checks.shared_checks import (
    check_group_names,
    check_selection,
    check_splits,
    given_settings,
    no_duplicates,
    refuse_given,
    task_spec_of,
)
from headprune.checks.speed_checks import check_speed
from headprune.core.checks import ConfigError, string_list, warn
from headprune.core.families import config_groups
from headprune.core.unit_kinds import KINDS, kinds_of, lsq_refusal, reconstruction_refusal, shrunk_fields, unit_name
from headprune.models.sources import config_fields, max_positions
from headprune.selection.mask_search import SHARES
from headprune.selection.unit_rearrange import rearrangement_refusal
from headprune.sources.orders import ORDERS
from headprune.sources.point_models import check_save
from headprune.sources.score_file import read_scores
from headprune.stages.greedy_stage import fractions_of
from headprune.stages.pareto_plan import plain, planned_points

PREDICTS = {"flops": "FLOPs", "latency": "seconds", "bytes": "weight bytes"}  # what each prune.cost predicts

# ---- prune --------------------------------------------------------------------------------------


def check_prune(cfg, prune, alone: bool = True) -> None:
    """prune.*: unrepeated lists, a floor below the layers' units, known splits and groups, fitting widths; scores_from, speed, reads."""
    for name in ("order", "recover", "extra_splits", "fractions", "vocab_text"):  # prune.groups: check_group_names; a schedule: its own
        value = prune.given.get(name)
        if OmegaConf.is_list(value):  # a repeat computes and writes the same points twice
            no_duplicates(value, f"prune.{name}")
    fields, k = config_fields(cfg.model), prune.floor
    for kind in prune.unit.kinds if fields is not None else ():
        units = kind.units_per_layer(fields)
        if units is not None and kind.layer_floor(k) >= units:
            raise ConfigError(
                f"prune.min_units_per_layer={k} keeps every {kind.noun} of prune.unit={prune.unit}: the model's layers have {units} "
                f"{kind.noun}s, so it must be at most {units - 1} (0 = no floor)"
            )
    check_splits(cfg, [prune.given.split, prune.given.ablation_split], "prune.split/ablation_split")
    check_group_names(cfg, prune.unit, prune.groups, "prune.groups")
    if prune.given.reestimate and prune.for_speed:  # it recomputes the plain curves' re-estimable orders
        raise ConfigError(
            "prune.reestimate=true re-estimates the plain pruning curves; with prune.target / schedule / recover / "
            "rearrange / measure_speed it would be ignored: drop it (prune.schedule re-scores after every step)"
        )
    if prune.given.reestimate and not any(ORDERS[order].reestimable for order in prune.orders):
        raise ConfigError(
            f"prune.reestimate=true, but no order of prune.order={list(prune.orders)} can be re-estimated: add one of "
            f"{[o for o, v in ORDERS.items() if v.reestimable]} or drop prune.reestimate"
        )
    check_joint_scale(cfg, prune, prune.orders)
    check_ffn_multiple(cfg, prune)
    for kind in (kind for kind in KINDS.values() if kind.width_setting):
        name, multiple = kind.width_setting, prune.given.get(kind.width_setting)  # e.g. prune.hidden_multiple: its kind's kept width
        if multiple is None:
            continue
        if kind not in prune.unit.kinds:
            raise ConfigError(
                f"prune.{name}={multiple} rounds the kept width of a kind prune.unit={prune.unit} does not prune: "
                f"use a unit with {kind.name} (prune.unit={kind.name} or a list with it, [kv_group,ffn,{kind.name}]), or drop it"
            )
        width = kind.units_per_layer(fields or {})
        if width is not None and int(multiple) > width:
            raise ConfigError(
                f"prune.{name}={multiple} is larger than the {width} {kind.noun}s of model {cfg.model.get('name')}: "
                f"every pruned width would round back to the whole; choose at most {width} (null = the config's own multiple)"
            )
    path = prune.given.get("scores_from")  # fixed scores for the plain curves, read now (before any model loads)
    if path is not None and prune.for_speed:
        raise ConfigError(
            f"prune.scores_from={path} ranks the plain pruning curves; pruning for speed (prune.target / schedule / recover / "
            "rearrange / measure_speed / extra_splits) scores its own model at every round: drop one of them"
        )
    if path is not None and prune.given.reestimate:
        raise ConfigError(
            f"prune.scores_from={path} reads fixed scores, and prune.reestimate=true recomputes them under every mask: drop one"
        )
    if path is not None:
        read_scores(path, list(prune.orders), prune.unit.name, prune.action)
    check_prune_for_speed(cfg, prune)
    check_conditional_reads(cfg, prune, alone)


def check_ffn_multiple(cfg, prune) -> None:
    """prune.ffn_multiple: rounds the FFN widths of a unit with FFN neurons, in one-shot masks (no schedule, no re-estimation)."""
    given, unit, multiple = prune.given, prune.unit, int(prune.given.ffn_multiple)
    if multiple == 1:
        return
    rounded = [kind for kind in unit.kinds if kind.runtime_multiple(given) > 1]
    if not rounded:
        raise ConfigError(
            f"prune.ffn_multiple={multiple} rounds the FFN widths, and prune.unit={unit} prunes no FFN neurons: "
            "use prune.unit=ffn or a list with ffn ([head,ffn], [kv_group,ffn]), or drop it"
        )
    if given.get("schedule") is not None:
        raise ConfigError(
            f"prune.ffn_multiple={multiple} rounds one-shot masks; prune.schedule prunes the pruned model again each round: "
            "use prune.target or prune.fractions with it"
        )
    if given.reestimate:
        raise ConfigError(f"prune.ffn_multiple={multiple} rounds the masks of fixed scores; drop prune.reestimate=true")
    width = rounded[0].units_per_layer(config_fields(cfg.model) or {})
    if width is not None and (multiple > width or width % multiple):
        divisors = [d for d in (8, 16, 32, 64, 128, 256) if width % d == 0 and d < width]
        raise ConfigError(
            f"prune.ffn_multiple={multiple} must divide the FFN width {width} of model {cfg.model.get('name')} (a larger or "
            f"non-dividing multiple rounds every pruned layer back to its whole width): choose one of {divisors or [1]}"
        )


def check_joint_scale(cfg, prune, orders) -> None:
    """prune.joint_scale: read by a joint unit only; ``loss`` meets scores as they are, so only loss estimates (fisher, importance)."""
    unit = prune.unit
    if not unit.is_joint:
        refuse_given(
            cfg,
            ("prune.joint_scale",),
            f"it says how the kinds of a joint unit ([head,ffn], [kv_group,ffn]) meet under one budget, and prune.unit={unit} has one kind",
        )
        return
    if str(prune.given.joint_scale) != "loss":
        return
    normalised = [name for name in ("normalize_layers", "normalize_global") if cfg.importance.get(name)]
    for order in orders:
        if order == "importance" and normalised:
            raise ConfigError(
                f"prune.joint_scale=loss compares the scores of the kinds of prune.unit={unit} as they are, as estimates of the "
                f"loss, and importance.{normalised[0]}=true rescales the importance scores (each layer's heads to the norm 1, "
                "whatever the loss): set importance.normalize_layers=false and importance.normalize_global=false, use "
                "prune.order=fisher, or prune.joint_scale=relative"
            )
        if order == "random":
            raise ConfigError(
                f"prune.joint_scale=loss compares the scores of the kinds of prune.unit={unit} as estimates of the loss, and "
                "prune.order=random draws scores that estimate nothing: use prune.joint_scale=relative (or another order)"
            )


def check_prune_for_speed(cfg, prune) -> None:
    """prune.target / schedule / cost / recover / rearrange / finetune / control / extra_splits / save / measure_speed / selection_split."""
    given, unit, rearrange = prune.given, prune.unit, prune.given.rearrange
    targets = [s for s in prune.steps if not isinstance(s, float)]
    refusals = {  # {a setting that asks what the unit cannot do: (why it cannot, what to do instead)}
        "prune.recover=lsq": (
            "lsq" in prune.recovering and lsq_refusal(unit),
            "drop lsq from prune.recover (finetune recovers any unit), or prune a unit with heads or neurons",
        ),
        f"prune.rearrange={rearrange}": (
            rearrange and rearrangement_refusal(unit),
            "drop prune.rearrange (or use prune.unit=head, kv_group, ffn or a joint list such as [kv_group,ffn])",
        ),
        "prune.recover=reconstruct": (
            "reconstruct" in prune.recovering and reconstruction_refusal(unit),
            "drop reconstruct from prune.recover (or prune head, kv_group, ffn or a joint list of them)",
        ),
    }
    for setting, (refusal, fix) in refusals.items():
        if refusal:
            raise ConfigError(f"{setting} with prune.unit={unit}: {refusal}; {fix}")
    if "reconstruct" in prune.recovering and given.reconstruct.target == "inputs" and "hidden_size" in shrunk_fields(unit):
        raise ConfigError(
            f"prune.reconstruct.target=inputs replays the unpruned layers on the pruned model's inputs, and prune.unit={unit} "
            "narrows those inputs (residual channels): use prune.reconstruct.target=teacher"
        )
    if rearrange and given.get("schedule") is not None:
        raise ConfigError(
            "prune.rearrange re-chooses the units of one-shot masks (prune.fractions or prune.target), "
            "not with prune.schedule: drop one of them"
        )
    untimed = [kind.name for kind in kinds_of(prune.unit) if kind.latency_parts() is None]  # prune.cost: latency tables per kind
    if given.cost == "latency" and untimed:
        raise ConfigError(
            f"prune.cost=latency with prune.unit={unit_name(prune.unit)}: {', '.join(untimed)} units have no latency tables "
            "(the timed attention and FFN widths do not say what they cost); use prune.cost=flops with a flops target"
        )
    for target in targets:  # a flops / bytes target needs that cost model
        if target.kind in SHARES and given.cost != target.kind:
            raise ConfigError(
                f"a {target.kind} target keeps a share of the model's {SHARES[target.kind]}, and prune.cost={given.cost} predicts "
                f"{PREDICTS[str(given.cost)]}: add prune.cost={target.kind} (or give a speedup target)"
            )
    if given.cost == "latency" and not targets:
        raise ConfigError(
            "prune.cost=latency chooses the heads that meet a target (prune.target or a schedule of targets); without one "
            "it would be ignored: add e.g. 'prune.target={speedup:1.3}' or drop prune.cost=latency"
        )
    fields = config_fields(cfg.model)  # prune.cost=bytes counts the weights one decoded token reads: no encoder-decoder
    groups = config_groups(fields) if fields is not None and str(given.cost) == "bytes" else None
    if groups and "enc_dec" in groups and "dec_self" in groups:
        raise ConfigError(
            f"prune.cost=bytes counts the weights one decoded token reads, and model {cfg.model.get('name')} is an "
            "encoder-decoder: its encoder's weights are read once per source, not per decoded token, so one count of both "
            "means nothing; use prune.cost=flops with a flops or speedup target"
        )
    positions = max_positions(cfg.model) if str(given.cost) == "latency" else None  # latency tables time prune.seq_len tokens
    if positions is not None and int(given.seq_len) > positions:
        raise ConfigError(
            f"prune.seq_len={given.seq_len}: prune.cost=latency times model {cfg.model.get('name')} on inputs of that "
            f"many tokens, but it takes at most {positions} positions: set prune.seq_len<={positions}"
        )
    if any(t.kind == "max_drop" for t in targets):
        check_selection(cfg, "prune")
    finetune = given.finetune  # a warm-up belongs to the decaying lr schedule; LoRA needs peft and a rank below every projection
    if finetune.warmup > 0 and not finetune.decay:
        raise ConfigError(
            f"prune.finetune.warmup={finetune.warmup} warms up the lr schedule of prune.finetune.decay=true only; with "
            "decay=false the lr is constant and the warm-up would be ignored: add prune.finetune.decay=true or drop the warm-up"
        )
    rank = finetune.get("lora_rank")
    if rank is not None and find_spec("peft") is None:
        raise ConfigError(
            "prune.finetune.lora_rank needs the peft package: pip install peft (headprune's llm extra), "
            "or prune.finetune.lora_rank=null for a full fine-tune"
        )
    smallest = smallest_projection(cfg.model) if rank is not None else None
    if smallest is not None and rank > smallest:
        raise ConfigError(
            f"prune.finetune.lora_rank={rank} is larger than the smallest projection LoRA adapts in model "
            f"{cfg.model.get('name')} ({smallest} features): a rank above it is no low-rank update; "
            f"choose at most {smallest} (e.g. 8 or 16), or null for a full fine-tune"
        )
    if given.control and "finetune" not in prune.recovering:  # the control is the unpruned model given the fine-tune
        raise ConfigError(
            "prune.control=true gives the unpruned model the same fine-tune as the pruned ones, but prune.recover "
            f"has no finetune ({given.recover!r}): add prune.recover=finetune (or a list with it), or drop prune.control"
        )
    extra = string_list(given.extra_splits, "prune.extra_splits")  # other splits than prune.split
    check_splits(cfg, extra, "prune.extra_splits")
    if str(given.split) in extra:
        raise ConfigError(f"prune.extra_splits={extra} repeats prune.split={given.split}: list other evaluation splits")
    save = plain(given.save)  # a choice or point names
    planned = planned_points(given, list(prune.orders), fractions_of(given)) if prune.for_speed and not isinstance(save, str) else None
    check_save(save, prune.for_speed, planned)  # each a point the settings make (the error lists them)
    if given.measure_speed:
        if cfg.get("speed") is None:
            raise ConfigError("prune.measure_speed=true needs the speed.* settings (experiment=prune and study have them)")
        check_speed(cfg.speed)


def smallest_projection(model_cfg) -> int | None:
    """min(in, out) over the attention and MLP projections a model's config describes (None: unknown)."""
    fields = config_fields(model_cfg)
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


# ---- settings read only when others say so ---------------------------------------------------------


def check_conditional_reads(cfg, prune, alone: bool = True) -> None:
    """prune.* settings read only when others say so, refused otherwise (``alone``: experiment=prune, the study ablates anyway)."""
    if not any(kind.text_floor for kind in prune.unit.kinds):  # prune.vocab_text: the splits whose tokens a vocabulary keeps
        refuse_given(
            cfg, ("prune.vocab_text",), f"it keeps the tokens of these splits' text, and prune.unit={prune.unit} removes no tokens"
        )
    drawn = [s for s in string_list(prune.given.vocab_text, "prune.vocab_text") if s != "importance" or s not in task_spec_of(cfg).splits]
    check_splits(cfg, drawn, "prune.vocab_text")
    given, recover, steps = prune.given, list(prune.recoveries), prune.recovering
    if given.get("fractions") is not None:
        refuse_given(cfg, ("prune.step", "prune.max_fraction"), "prune.fractions lists the fractions itself")
    for step, what in (("finetune", "the fine-tune"), ("lsq", "the least squares"), ("reconstruct", "the reconstruction")):
        if step not in steps:
            why = f"prune.{step}.* sets {what} of prune.recover={step}, and prune.recover={recover} runs none (add {step} to prune.recover)"
            refuse_given(cfg, (f"prune.{step}",), why)
    if recover == ["none"] * len(recover) and given.get("schedule") is None:
        refuse_given(cfg, ("prune.recover_examples",), "the examples of a recovery (lsq, finetune), and prune.recover=none")
    wanted = given_settings(cfg, "prune").get("prune.recover_examples")
    for key in ("data.limits.importance", "data.importance_size"):  # recovery's examples come from the importance subset
        limit = OmegaConf.select(cfg, key, default=None)
        if isinstance(limit, int) and isinstance(wanted, int) and wanted > limit:
            warn(f"prune.recover_examples={wanted} exceeds the importance subset ({key}={limit}): recovery uses {limit}; raise {key}")
    if given.finetune.get("tokens") is not None:
        refuse_given(
            cfg,
            ("prune.finetune.max_steps",),
            f"with prune.finetune.tokens={given.finetune.tokens} the fine-tune is one pass over the budget's batches",
        )
    if not given.finetune.get("layer_distill"):
        refuse_given(cfg, ("prune.finetune.layer_loss",), "it normalises the layer loss, and prune.finetune.layer_distill=0 adds none")
    if given.finetune.get("lora_rank") is None:
        refuse_given(cfg, ("prune.finetune.lora_alpha",), "LoRA's scale needs prune.finetune.lora_rank (null: a full fine-tune)")
    check_finetune_teacher(cfg, given)
    targets = [s for s in prune.steps if not isinstance(s, float)]
    if not any(t.kind == "max_drop" for t in targets):
        refuse_given(cfg, ("prune.selection_split",), "it is where a max_drop target is measured, and no prune.target / schedule has one")
    if str(given.cost) != "latency":
        refuse_given(cfg, ("prune.latency_batch_size",), "it is the batch of prune.cost=latency's tables")
    if not prune.for_speed:
        refuse_given(cfg, ("prune.seq_len",), "it sizes the cost model of pruning for speed (prune.target / schedule / recover ...)")
    if "duo" not in prune.orders:
        refuse_given(cfg, ("prune.duo",), "prune.duo.* trains the gates of the duo order, which prune.order does not have")
    if not {"obs", "obs_fisher"} & set(prune.orders):
        why = "it says how the obs orders price a unit, and prune.order has neither obs nor obs_fisher"
        refuse_given(cfg, ("prune.obs_bias", "prune.obs_tokens"), why)
    if alone and "ablation" not in prune.orders:
        refuse_given(cfg, ("prune.ablation_split", "prune.n_samples"), "they set the ablation order, which prune.order does not have")


def physical_pruning(prune) -> str | None:
    """What in experiment=prune removes heads physically (None: it only masks them)."""
    if not prune.for_speed:
        return None
    given, recover, save = prune.given, list(prune.recoveries), plain(prune.given.save)
    uses = {
        "prune.recover=finetune fine-tunes a pruned copy": "finetune" in prune.recovering,
        "prune.measure_speed=true times pruned copies": bool(given.measure_speed),
        "prune.schedule removes heads at every step": given.get("schedule") is not None,
        "prune.cost=latency times pruned copies": str(given.cost) == "latency",
        f"prune.save={save} keeps pruned models": save != "none" and (save == "all" or not isinstance(save, str) or recover != ["none"]),
    }
    return next((what for what, used in uses.items() if used), None)


def check_finetune_teacher(cfg, given) -> None:
    """prune.finetune.teacher=control: the control must be trained (prune.control=true), once (no schedule), and distilled from."""
    if str(given.finetune.teacher) != "control":
        return
    if not given.control:
        raise ConfigError(
            "prune.finetune.teacher=control distils the pruned points from the control, and prune.control=false trains none: "
            "set prune.control=true, or prune.finetune.teacher=unpruned"
        )
    if given.get("schedule") is not None:
        raise ConfigError(
            "prune.finetune.teacher=control is not with prune.schedule: the control is fine-tuned in the schedule's rounds, "
            "so no one control model stands beside every step; use prune.fractions or prune.target, or prune.finetune.teacher=unpruned"
        )
    if not float(given.finetune.distill_weight) and not float(given.finetune.layer_distill):
        refuse_given(cfg, ("prune.finetune.teacher",), "prune.finetune.distill_weight=0 and layer_distill=0 distil from no teacher")
