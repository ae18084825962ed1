#!/usr/bin/env bash
# Train the section-1 MiniLM on MNLI (or take MODEL=<a trained model directory>), then run the unit table (heads, FFN
# neurons, both, and both with residual channels; distilled fine-tune with its control; retraining-free fisher +
# rearrangement + least squares) on it, in one command, on an accelerator machine or on the CPU.
#   MODEL=outputs/nli_mnli_minilm/model TRAINER=cpu bash tools/unit_table.sh   # on this machine, from the trained model
#   ONLY="units_ffn units_joint" MODEL=... TRAINER=cpu bash tools/unit_table.sh # some runs only, in the order given
#   python tools/gpu_bundle.py pack --out .gpu                       # here, first; .gpu is ignored and carried
#   pip download --no-deps --only-binary=:all: -d .gpu/wheels hydra-core==1.3.8 omegaconf==2.3.1
#   pip wheel --no-deps -w .gpu/wheels antlr4-python3-runtime==4.9.3  # no wheel on PyPI: built here (pure Python)
#   BUNDLE=.gpu OUT=$OUT bash tools/unit_table.sh                 # there
#   QUICK=1 TRAINER=cpu bash tools/unit_table.sh                  # a smoke test of every command on a few examples
# Returns under $OUT: units_results.tar.gz (every run's results.json and log) and the trained model as fp16 parts
# (tools/gpu_bundle.py join restores it). Throughput depends on the shapes alone: here, prune the joined model with
# prune.scores_from=<a returned results.json> (the same units ranked, the same masks) and time it with tools/onnx_numbers.py.
set -u
BUNDLE=${BUNDLE:-.gpu}
OUT=${OUT:-/tmp/unit_table_out}
RUNS=${RUNS:-/tmp/unit_table_runs}
TRAINER=${TRAINER:-gpu}
PY=${PY:-python3}
export PYTHONPATH=$PWD WANDB_MODE=disabled
[ -d "$BUNDLE/data" ] && export HEADPRUNE_DATA_DIR=$PWD/$BUNDLE/data  # the bundle's MNLI copy; else paths.data_dir
mkdir -p "$OUT" "$RUNS"
if [ -d "$BUNDLE/wheels" ]; then  # packages the machine's image lacks (hydra-core, omegaconf, antlr4), as wheels
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$BUNDLE"/wheels/*.whl || exit
  export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

QUICK_ARGS=()
TRAIN_ARGS=(trainer.max_epochs=1)
FT_EXAMPLES=6400 FT_STEPS=200
if [ "${QUICK:-0}" = 1 ]; then
  QUICK_ARGS=(data.limit_eval=64 data.importance_size=64)
  TRAIN_ARGS=(trainer.max_epochs=1 data.limit_train=64)
  FT_EXAMPLES=64 FT_STEPS=2
fi
DEVICE=cuda
[ "$TRAINER" = cpu ] && DEVICE=cpu

run() {  # name, then the arguments of one headprune run; a failed run is logged and the next one goes on
  local name=$1; shift
  [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]] && return
  local start=$SECONDS
  $PY -m headprune.cli "$@" logger=csv "${QUICK_ARGS[@]}" hydra.run.dir="$RUNS/$name" >"$RUNS/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$RUNS/summary.txt"
}

if [ -z "${MODEL:-}" ]; then
$PY tools/gpu_bundle.py restore --src "$BUNDLE/minilm" --out "$RUNS/base"
TRAINED=1
run nli_mnli_minilm experiment=nli_finetune model.pretrained="$RUNS/base" task.lr=1e-4 trainer="$TRAINER" \
  trainer.precision=32-true trainer.check_val_every_n_epoch=2 trainer.enable_progress_bar=false "${TRAIN_ARGS[@]}"
fi
MODEL=${MODEL:-$RUNS/nli_mnli_minilm/model}
M=(experiment=prune model=minilm data=nli_local model.pretrained="$MODEL" prune.order=fisher device=$DEVICE)
F=(prune.recover=finetune prune.control=true prune.finetune.examples=$FT_EXAMPLES prune.finetune.max_steps=$FT_STEPS
   prune.finetune.lr=5e-5 prune.finetune.decay=true prune.finetune.warmup=0.1 prune.finetune.seed=7)
F600=("${F[@]/max_steps=$FT_STEPS/max_steps=$((3 * FT_STEPS))}")  # three times the steps, on three times the examples
F600=("${F600[@]/examples=$FT_EXAMPLES/examples=$((3 * FT_EXAMPLES))}")
F25=("${F[@]/prune.control=true/prune.control=false}")  # the control does not depend on the target: x1.8's serves x2.5
FREE=(prune.recover=lsq prune.rearrange=both)
run units_head "${M[@]}" prune.unit=head 'prune.target={speedup:1.4}' "${F[@]}"
run units_ffn "${M[@]}" prune.unit=ffn 'prune.target={speedup:1.8}' "${F[@]}"
run units_joint "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${F[@]}"
run units_joint_600 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${F600[@]}"
run units_ffn_25 "${M[@]}" prune.unit=ffn 'prune.target={speedup:2.5}' "${F25[@]}"
run units_joint_25 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${F25[@]}"
run units_free_head "${M[@]}" prune.unit=head 'prune.target={speedup:1.4}' "${FREE[@]}"  # x1.5 removes every head
run units_free_ffn "${M[@]}" prune.unit=ffn 'prune.target={speedup:1.5}' "${FREE[@]}"
run units_free_joint "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' "${FREE[@]}"
run units_hidden "${M[@]}" 'prune.unit=[head,ffn,hidden]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${F[@]}"
run units_hidden_25 "${M[@]}" 'prune.unit=[head,ffn,hidden]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${F25[@]}"
run units_free_hidden "${M[@]}" 'prune.unit=[head,ffn,hidden]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=lsq  # one width: nothing to rearrange
run units_free_ffn_25 "${M[@]}" prune.unit=ffn 'prune.target={speedup:2.5}' "${FREE[@]}"
run units_free_joint_25 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${FREE[@]}"
run units_free_hidden_25 "${M[@]}" 'prune.unit=[head,ffn,hidden]' prune.joint_scale=loss 'prune.target={speedup:2.5}' prune.recover=lsq
# compensation: layer-wise reconstruction of the kept units' consumers, and units chosen by their cost after it (obs)
OBS=("${M[@]/prune.order=fisher/prune.order=obs}" prune.obs_bias=false)  # the obs runs below price units with each bias fixed
run units_recon_joint "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.rearrange=true prune.recover=reconstruct prune.recover_examples=1000
run units_obs_joint "${OBS[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000
run units_recon_joint_20 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.0}' prune.rearrange=true prune.recover=reconstruct prune.recover_examples=1000
run units_obs_joint_20 "${OBS[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.0}' prune.recover=reconstruct prune.recover_examples=1000
run units_recon_hidden "${M[@]}" 'prune.unit=[head,ffn,hidden]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000
# residual channels alone at x1.5: the mask alone and reconstructed (readers on the kept channels, writers on their rows)
run units_recon_hidden_alone "${M[@]}" prune.unit=hidden 'prune.target={speedup:1.5}' 'prune.recover=[none,reconstruct]' prune.recover_examples=1000
# reconstruction before a distilled fine-tune that also matches every kept layer's output to its teacher layer (CoFi)
CHAIN=("${F[@]/prune.recover=finetune/prune.recover=reconstruct+finetune}" prune.finetune.layer_distill=1.0 prune.recover_examples=1000 prune.rearrange=true)
CHAIN25=("${CHAIN[@]/prune.control=true/prune.control=false}")
run units_chain_joint "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${CHAIN[@]}"
run units_chain_joint_25 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25[@]}"
CHAIN25_600=("${CHAIN25[@]/max_steps=$FT_STEPS/max_steps=$((3 * FT_STEPS))}")  # three times the steps, on three times the examples
CHAIN25_600=("${CHAIN25_600[@]/examples=$FT_EXAMPLES/examples=$((3 * FT_EXAMPLES))}")
CHAIN600=("${CHAIN[@]/max_steps=$FT_STEPS/max_steps=$((3 * FT_STEPS))}")
CHAIN600=("${CHAIN600[@]/examples=$FT_EXAMPLES/examples=$((3 * FT_EXAMPLES))}")
run units_chain_joint_600 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${CHAIN600[@]}"
run units_chain_joint_25_600 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_600[@]}"
# the next levers at x1.8, each with its control trained alike: twice the lr; four times the layer-loss weight
CHAIN_LR=("${CHAIN[@]/prune.finetune.lr=5e-5/prune.finetune.lr=1e-4}")
CHAIN_LD=("${CHAIN[@]/prune.finetune.layer_distill=1.0/prune.finetune.layer_distill=4.0}")
run units_chain_joint_lr "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${CHAIN_LR[@]}"
run units_chain_joint_ld "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${CHAIN_LD[@]}"
# distillation alone (CoFi's loss: the teacher's logits and layers, no labels), three times the steps; its control starts
# at the teacher, so it measures what the same training does to the unpruned model
CHAIN_KD=("${CHAIN600[@]}" prune.finetune.distill_weight=1.0)
CHAIN25_KD=("${CHAIN25_600[@]}" prune.finetune.distill_weight=1.0)
run units_chain_joint_kd "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${CHAIN_KD[@]}"
run units_chain_joint_25_kd "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_KD[@]}"

# the calibration lever, retraining-free: four times the importance subset (Fisher scores) and the reconstruction examples
CAL=(data.importance_size=8000 prune.recover=reconstruct prune.recover_examples=4000)
run units_recon_joint_cal "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.rearrange=true "${CAL[@]}"
# the calibration lever under the obs order at x2.0 and x1.5: twice the importance subset (second moments) and the reconstruction examples
CAL2=(data.importance_size=4000 prune.recover=reconstruct prune.recover_examples=2000)
run units_obs_joint_20_cal2 "${OBS[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.0}' "${CAL2[@]}"
run units_obs_joint_cal2 "${OBS[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' "${CAL2[@]}"
# the order lever before distillation: units chosen by obs, reconstructed, then distilled alone as units_chain_joint_kd
# (whose control, trained with the same fine-tune, serves it)
CHAIN_OBS_KD=()
for arg in "${CHAIN_KD[@]}"; do
  case $arg in prune.rearrange=*) ;; prune.control=*) CHAIN_OBS_KD+=(prune.control=false) ;; *) CHAIN_OBS_KD+=("$arg") ;; esac
done
run units_chain_obs_kd "${OBS[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${CHAIN_OBS_KD[@]}"

# twice the distillation-only steps at x1.8, on twice the examples; no control of its own (one trained alike stays at the
# teacher, see units_chain_joint_kd), so it is set against the unpruned model
CHAIN_KD1200=("${CHAIN_KD[@]/max_steps=$((3 * FT_STEPS))/max_steps=$((6 * FT_STEPS))}")
CHAIN_KD1200=("${CHAIN_KD1200[@]/examples=$((3 * FT_EXAMPLES))/examples=$((6 * FT_EXAMPLES))}")
CHAIN_KD1200=("${CHAIN_KD1200[@]/prune.control=true/prune.control=false}")
run units_chain_joint_kd_1200 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${CHAIN_KD1200[@]}"

# four times the distillation-only steps at x1.8, on four times the examples (76,800 of the 82,667), set against the
# unpruned model as units_chain_joint_kd_1200 is
CHAIN_KD2400=("${CHAIN_KD1200[@]/max_steps=$((6 * FT_STEPS))/max_steps=$((12 * FT_STEPS))}")
CHAIN_KD2400=("${CHAIN_KD2400[@]/examples=$((6 * FT_EXAMPLES))/examples=$((12 * FT_EXAMPLES))}")
run units_chain_joint_kd_2400 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.8}' "${CHAIN_KD2400[@]}"

# the same 2,400 distillation-only steps at x2.5 (no control: CHAIN25_KD has none)
CHAIN25_KD2400=("${CHAIN25_KD[@]/max_steps=$((3 * FT_STEPS))/max_steps=$((12 * FT_STEPS))}")
CHAIN25_KD2400=("${CHAIN25_KD2400[@]/examples=$((3 * FT_EXAMPLES))/examples=$((12 * FT_EXAMPLES))}")
run units_chain_joint_25_kd_2400 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_KD2400[@]}"

# six times the x2.5 distillation-only steps (3,600), on 82,560 of the 82,667 training examples: past one pass, the
# batches cycle
CHAIN25_KD3600=("${CHAIN25_KD[@]/max_steps=$((3 * FT_STEPS))/max_steps=$((18 * FT_STEPS))}")
CHAIN25_KD3600=("${CHAIN25_KD3600[@]/examples=$((3 * FT_EXAMPLES))/examples=$((129 * FT_EXAMPLES / 10))}")
run units_chain_joint_25_kd_3600 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_KD3600[@]}"

# the same 2,400 distillation-only steps at x2.5, in two rounds (CoFi prunes while it distils): x1.8, reconstructed and
# distilled 1,200 steps on 38,400 examples, re-scored on that model, then x2.5 and 1,200 steps more on other examples;
# a schedule re-chooses units itself, so there is no rearrangement
CHAIN25_KD_SCHED=()
for arg in "${CHAIN25_KD[@]}"; do
  case $arg in
    prune.rearrange=*) ;;
    prune.finetune.max_steps=*) CHAIN25_KD_SCHED+=(prune.finetune.max_steps=$((6 * FT_STEPS))) ;;
    prune.finetune.examples=*) CHAIN25_KD_SCHED+=(prune.finetune.examples=$((6 * FT_EXAMPLES))) ;;
    *) CHAIN25_KD_SCHED+=("$arg") ;;
  esac
done
run units_chain_joint_25_kd_sched "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss \
  'prune.schedule=[{speedup:1.8},{speedup:2.5}]' "${CHAIN25_KD_SCHED[@]}"

# the lr lever on the one-shot x2.5 distillation: the same 2,400 steps at the lr the MiniLM was trained with (1e-4)
CHAIN25_KD2400_LR=("${CHAIN25_KD2400[@]/prune.finetune.lr=5e-5/prune.finetune.lr=1e-4}")
run units_chain_joint_25_kd_2400_lr "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_KD2400_LR[@]}"

# the ridge lever, retraining-free at x1.5: a tenth and ten times the default pull towards the kept weights; the teacher's
# stream as target
RECON=(prune.rearrange=true prune.recover=reconstruct prune.recover_examples=1000)
run units_recon_joint_r01 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' "${RECON[@]}" prune.reconstruct.ridge=0.1
run units_recon_joint_teacher "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' "${RECON[@]}" prune.reconstruct.target=teacher
run units_recon_joint_r10 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' "${RECON[@]}" prune.reconstruct.ridge=10
# the same rearranged mask with no recovery at all, evaluated on every example beside the reconstructed ones
run units_mask_joint "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.rearrange=true prune.recover=none

# two levers on the x2.5 distillation-only 2,400 steps: units chosen by obs on twice the calibration (ahead of Fisher at
# x2.0 retraining-free), and the logits alone (no layer loss)
CHAIN25_OBS_KD2400=()
for arg in "${CHAIN25_KD2400[@]}"; do
  case $arg in prune.rearrange=*) ;; prune.recover_examples=*) CHAIN25_OBS_KD2400+=(prune.recover_examples=2000) ;; *) CHAIN25_OBS_KD2400+=("$arg") ;; esac
done
run units_chain_obs_25_kd_2400_cal2 "${OBS[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' data.importance_size=4000 "${CHAIN25_OBS_KD2400[@]}"
CHAIN25_KD2400_LD0=("${CHAIN25_KD2400[@]/prune.finetune.layer_distill=1.0/prune.finetune.layer_distill=0.0}")
run units_chain_joint_25_kd_2400_ld0 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_KD2400_LD0[@]}"
# the layer-loss weight lever on the same 2,400 steps: four times CoFi's layer loss (the logits alone cost 0.9 points)
CHAIN25_KD2400_LD4=("${CHAIN25_KD2400[@]/prune.finetune.layer_distill=1.0/prune.finetune.layer_distill=4.0}")
run units_chain_joint_25_kd_2400_ld4 "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_KD2400_LD4[@]}"
# the layer loss normalised per token (each token's error by its own teacher norm) on the same 2,400 steps
run units_chain_joint_25_kd_2400_tok "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_KD2400[@]}" prune.finetune.layer_loss=token

# the obs order with each output feature's error weighted by its mean squared loss gradient (obs_fisher), so that
# layers compare on the loss scale, retraining-free at x1.5 and x2.0
OBSF=("${M[@]/prune.order=fisher/prune.order=obs_fisher}" prune.obs_bias=false)
run units_obsf_joint "${OBSF[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000
run units_obsf_joint_20 "${OBSF[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.0}' prune.recover=reconstruct prune.recover_examples=1000
# obs_fisher on four times the calibration examples at x1.5 (more calibration texts made it the best order on SmolLM2)
run units_obsf_joint_cal4 "${OBSF[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' data.importance_size=8000 prune.recover=reconstruct prune.recover_examples=1000
# residual channels beside heads and neurons, each channel priced by the surgeon over every projection reading the stream
run units_obsf_joint_hidden "${OBSF[@]}" 'prune.unit=[head,ffn,hidden]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000
# the same points with each projection's bias re-solved beside its kept columns while pricing (prune.obs_bias=true, the default)
OBS_B=("${M[@]/prune.order=fisher/prune.order=obs}")
OBSF_B=("${M[@]/prune.order=fisher/prune.order=obs_fisher}")
run units_obs_joint_b "${OBS_B[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000
run units_obs_joint_20_b "${OBS_B[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.0}' prune.recover=reconstruct prune.recover_examples=1000
run units_obs_joint_20_cal2_b "${OBS_B[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.0}' "${CAL2[@]}"
run units_obs_joint_cal2_b "${OBS_B[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' "${CAL2[@]}"
run units_obsf_joint_b "${OBSF_B[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000
run units_obsf_joint_20_b "${OBSF_B[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.0}' prune.recover=reconstruct prune.recover_examples=1000
run units_obsf_joint_cal4_b "${OBSF_B[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' data.importance_size=8000 prune.recover=reconstruct prune.recover_examples=1000
run units_obsf_joint_hidden_b "${OBSF_B[@]}" 'prune.unit=[head,ffn,hidden]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000
# each calibration token weighted in the fits by the unpruned model's squared loss gradient at the projection's output
run units_recon_joint_grad "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.rearrange=true prune.recover=reconstruct prune.recover_examples=1000 prune.reconstruct.tokens=gradient
run units_obsf_joint_grad "${OBSF_B[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000 prune.reconstruct.tokens=gradient
# the surgeon's second moments weighted alike (prune.obs_tokens=gradient: units priced on the tokens the loss reads), uniform fits
run units_obsf_joint_tok "${OBSF_B[@]}" prune.obs_tokens=gradient 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.recover=reconstruct prune.recover_examples=1000
run units_obsf_joint_20_tok "${OBSF_B[@]}" prune.obs_tokens=gradient 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.0}' prune.recover=reconstruct prune.recover_examples=1000
# the x2.5 distillation-only 2,400 steps from the obs_fisher mask priced on the gradient-weighted tokens (ahead at x2.0)
run units_chain_obsf_tok_25_kd_2400 "${OBSF_B[@]}" prune.obs_tokens=gradient 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:2.5}' "${CHAIN25_OBS_KD2400[@]/prune.recover_examples=2000/prune.recover_examples=1000}"
# the uniform fits on the Fisher + rearrangement mask of this model, beside units_recon_joint_grad's
run units_recon_joint_u "${M[@]}" 'prune.unit=[head,ffn]' prune.joint_scale=loss 'prune.target={speedup:1.5}' prune.rearrange=true prune.recover=reconstruct prune.recover_examples=1000

(cd "$RUNS" && tar czf "$OUT/units_results.tar.gz" summary.txt ./*.log ./*/results.json ./*/.hydra/overrides.yaml 2>/dev/null)
[ -n "${TRAINED:-}" ] && [ -f "$MODEL/model.safetensors" ] && $PY tools/gpu_bundle.py export --src "$MODEL" --out "$OUT/model"
cat "$RUNS/summary.txt"
