#!/usr/bin/env bash
# A one-node SLURM cluster on this machine, then the README's two SLURM forms on it: a 2-job CPU sweep through
# hydra-submitit-launcher (hydra/launcher=slurm_cpu) and a 2-process DDP fine-tune under srun (trainer=ddp_cpu).
# Debian or Ubuntu, as root: installs slurmctld, slurmd and munge with apt, writes a one-node slurm.conf, starts
# the daemons (stopped again at the end), runs both on tiny models and synthetic data. `make test-slurm`; not in `make test`.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
WORK=${SLURM_TEST_DIR:-$(mktemp -d /tmp/headprune-slurm.XXXXXX)}
CONF_DIR=/etc/slurm
NODE=$(hostname -s)
TINY=(model=tiny_bert data=nli_synthetic data.synthetic.train_size=240 data.synthetic.eval_size=60
      data.synthetic.mismatched_size=40 data.importance_size=40 data.batch_size=16 logger=none)

if [ "$(id -u)" != 0 ]; then
  echo "tools/slurm_local.sh installs and starts slurmctld, slurmd and munge: run it as root" >&2
  exit 2
fi
echo "[slurm] work directory: $WORK"
mkdir -p "$WORK/state" "$WORK/spool"

# ---- packages -------------------------------------------------------------------------------------
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q slurmctld slurmd munge
fi

# ---- munge: the authentication daemon --------------------------------------------------------------
STARTED=()
stop_all() {
  for pidfile in "${STARTED[@]}"; do
    [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
  done
}
trap stop_all EXIT

if [ ! -s /etc/munge/munge.key ]; then
  mungekey --create 2>/dev/null || dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
if ! munge -n >/dev/null 2>&1; then
  runuser -u munge -- /usr/sbin/munged
  STARTED+=(/run/munge/munged.pid)
  sleep 1
fi
munge -n | unmunge >/dev/null

# ---- a one-node cluster --------------------------------------------------------------------------
CPUS=$(( $(nproc) > 2 ? $(nproc) : 2 ))   # srun's two DDP tasks need two CPUs (config_overrides: use these numbers)
MEMORY=$(( $(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo) - 1024 ))
mkdir -p "$CONF_DIR"
cat > "$CONF_DIR/slurm.conf" <<EOF
ClusterName=headprune
SlurmctldHost=$NODE
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
NodeName=$NODE CPUs=$CPUS RealMemory=$MEMORY State=UNKNOWN
PartitionName=cpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
slurmctld -i && STARTED+=("$WORK/slurmctld.pid")
slurmd && STARTED+=("$WORK/slurmd.pid")
for _ in $(seq 30); do
  sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)' && break
  sleep 1
done
sinfo

# ---- a 2-job CPU sweep through the submitit launcher ---------------------------------------------
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 WANDB_MODE=offline
echo "[slurm] sweep: hydra/launcher=slurm_cpu experiment=prune prune.order=importance,random"
"$PY" -m headprune.cli -m hydra/launcher=slurm_cpu hydra.launcher.timeout_min=20 experiment=prune \
  prune.order=importance,random prune.step=0.5 device=cpu "${TINY[@]}" "hydra.sweep.dir=$WORK/sweep"
for job in 0 1; do
  test -s "$WORK/sweep/$job/results.json" || { echo "[slurm] sweep job $job wrote no results.json" >&2; exit 1; }
done

# ---- DDP training under srun: two tasks, one process each ---------------------------------------
echo "[slurm] srun -N1 --ntasks-per-node=2 headprune experiment=nli_finetune trainer=ddp_cpu"
srun -N1 --ntasks-per-node=2 --overcommit "$PY" -m headprune.cli experiment=nli_finetune trainer=ddp_cpu \
  trainer.max_epochs=1 trainer.enable_progress_bar=false "${TINY[@]}" "hydra.run.dir=$WORK/ddp"
test -s "$WORK/ddp/results.json" || { echo "[slurm] the srun DDP training wrote no results.json" >&2; exit 1; }
echo "[slurm] both ran: $WORK/sweep/{0,1}/results.json and $WORK/ddp/results.json"
