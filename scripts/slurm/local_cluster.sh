#!/usr/bin/env bash
# A real single-node SLURM on this machine (Debian's slurm-wlm + munge: slurmctld and slurmd
# on localhost), driven the way a user drives a cluster: omnibert-train -m with
# hydra/launcher=slurm. It runs
#   1. a 2-job sweep (optimizer.lr=1e-4,2e-4): each job must train in its own directory under
#      the sweep dir (checkpoints, plan, summary), and
#   2. one job with a two-minute time limit that cannot finish in one allocation: SLURM signals
#      it, the training writes last.ckpt + resume.json, submitit requeues it (scontrol
#      requeue) and the requeued job resumes; its final weights must equal, bit for bit, an
#      uninterrupted run of the same command outside SLURM,
# then checks all of that and prints one line per check. Exit status 0 when every check holds.
#
#   sudo scripts/slurm/local_cluster.sh        # as root: installs the packages if missing
#
# Needs root (daemons, munge key). WORK (default /tmp/omnibert-slurm) holds the cluster's
# state, the logs and the runs; the daemons are stopped on exit (KEEP=1 leaves them running).
# The timed-out job is slowed down until its first requeue by the test suite's fault
# injector (tests/faults.py SlowUntilResumed, 1 s per step), so that it reaches its limit on
# any machine. SLURM may signal up to a minute before the time asked for (its timer's
# resolution), hence two minutes with the signal 30 s before the end. slurmctld holds a
# requeued job for a while before it is eligible again (about 3 minutes here).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
PY=${PYTHON:-$REPO/.venv/bin/python}
WORK=${WORK:-/tmp/omnibert-slurm}
TRAIN=(env PYTHONPATH="$REPO/tests" "$(dirname "$PY")/omnibert-train")

[[ $(id -u) == 0 ]] || { echo "local_cluster.sh: run as root (it starts munged, slurmctld and slurmd)"; exit 2; }
[[ -x $PY ]] || { echo "local_cluster.sh: no $PY; run make install first or set PYTHON="; exit 2; }
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge
fi
"$PY" -c "import hydra_plugins.hydra_submitit_launcher" 2>/dev/null ||
    { echo "local_cluster.sh: hydra-submitit-launcher missing; pip install -e '.[slurm]'"; exit 2; }

rm -rf "$WORK" && mkdir -p "$WORK"/{state,spool,runs}
HOST=$(hostname -s)
CPUS=$(nproc)
MEM_MB=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 1024 ))
export SLURM_CONF=$WORK/slurm.conf
cat > "$SLURM_CONF" <<EOF
ClusterName=omnibert-local
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/slurmctld.log
SlurmdLogFile=$WORK/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
MpiDefault=none
JobRequeue=1
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
InactiveLimit=0
KillWait=30
MinJobAge=600
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$MEM_MB State=UNKNOWN
PartitionName=local Nodes=$HOST Default=YES MaxTime=INFINITE State=UP
EOF

cleanup() {
    if [[ ${KEEP:-0} != 1 ]]; then
        scancel --user=root >/dev/null 2>&1 || true
        pkill -x slurmd || true; pkill -x slurmctld || true; pkill -x munged || true
    fi
}
trap cleanup EXIT

[[ -s /etc/munge/munge.key ]] || mungekey --create --keyfile=/etc/munge/munge.key
chown munge:munge /etc/munge/munge.key && chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/log/munge /var/lib/munge && chown munge:munge /run/munge /var/log/munge /var/lib/munge
pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
pkill -x slurmd || true; pkill -x slurmctld || true
slurmctld -i
slurmd
for _ in $(seq 60); do
    sinfo -h -o %T 2>/dev/null | grep -qx idle && break
    sleep 1
done
sinfo -h -o "%P %D %T %C" | sed 's/^/sinfo: /'
sinfo -h -o %T | grep -qx idle || { echo "local_cluster.sh: the node did not become idle; see $WORK/slurmd.log"; exit 1; }

COMMON=(experiment=smoke phase.max_steps=160 val_every_n_steps=80 data.num_train_samples=4096
        callbacks.checkpoint.every_n_train_steps=80)
LAUNCH=(hydra/launcher=slurm hydra.launcher.cpus_per_task=1 hydra.launcher.partition=local
        "hydra.launcher.setup=['export OMP_NUM_THREADS=1']")
# run "$@" with its output in $WORK/$name.out; on failure show the end of it
logged() {
    local name=$1; shift
    "$@" > "$WORK/$name.out" 2>&1 || { tail -25 "$WORK/$name.out"; echo "local_cluster.sh: $name failed (log: $WORK/$name.out)"; exit 1; }
}

echo "== 1. a 2-job sweep through sbatch"
start=$(date +%s)
logged sweep "${TRAIN[@]}" -m "${COMMON[@]}" "${LAUNCH[@]}" hydra.launcher.timeout_min=30 \
    "optimizer.lr=1e-4,2e-4" "hydra.sweep.dir=$WORK/runs/sweep"
echo "sweep: exit 0 after $(( $(date +%s) - start )) s"

echo "== 2. a job that reaches its two-minute limit, is requeued and resumes"
OMP_NUM_THREADS=1 logged straight "${TRAIN[@]}" "${COMMON[@]}" \
    "paths.output_root=$WORK/runs/straight" run_name=straight
start=$(date +%s)
logged requeue "${TRAIN[@]}" -m "${COMMON[@]}" "${LAUNCH[@]}" hydra.launcher.timeout_min=2 \
    hydra.launcher.signal_delay_s=30 "hydra.sweep.dir=$WORK/runs/requeue" \
    "+callbacks.slow={_target_:faults.SlowUntilResumed,seconds:1.0}"
echo "requeue: exit 0 after $(( $(date +%s) - start )) s"

echo "== checks"
WORK=$WORK "$PY" - <<'EOF'
import json, os, re, sys
from pathlib import Path
import torch

work = Path(os.environ["WORK"])
failed = []

def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failed.append(what)

def jobs(sweep):
    return sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))

def weights(path):
    return torch.load(path, map_location="cpu", weights_only=True)["state_dict"]

sweep = jobs(work / "runs" / "sweep")
check(len(sweep) == 2, f"the sweep made {len(sweep)} job directories under its sweep dir")
for job in sweep:
    name = "lr=" + job.name.split("optimizer.lr=")[1].split(",")[0]
    summary = json.loads((job / "summary.json").read_text())
    plan = json.loads((job / "plan.json").read_text())
    check(summary["steps"] == 160 and (job / "checkpoints" / "last.ckpt").is_file(),
          f"job {name}: trained 160 steps, last.ckpt in its own checkpoints/")
    check(plan["checkpoint_dir"] == str((job / "checkpoints").resolve()),
          f"job {name}: plan.json names its own checkpoint dir")
arrays = sorted(p.name for p in (work / "runs" / "sweep" / ".submitit").iterdir()
                if p.is_dir() and "_" in p.name)
check(len(arrays) == 2, f"the sweep ran as the SLURM array tasks {arrays}")

(job,) = jobs(work / "runs" / "requeue")
(slurm_id,) = [p.name for p in (work / "runs" / "requeue" / ".submitit").iterdir() if p.name.isdigit()]
logs = "".join(p.read_text(errors="replace")
               for p in (work / "runs" / "requeue" / ".submitit").rglob("*_log.*"))
ctld = (work / "slurmctld.log").read_text(errors="replace")
# the main scheduler logs "sched: Allocate JobId=N", the backfill one "Started JobId=N"
allocations = len(re.findall(rf"(?:Allocate|Started) JobId={slurm_id} ", ctld))
check("timed-out" in logs, f"SLURM signalled job {slurm_id} before its time limit (submitit: 'timed-out')")
check(f"Requeuing JobId={slurm_id}" in ctld and allocations == 2,
      f"slurmctld requeued job {slurm_id} and allocated it again ({allocations} allocations)")
check("Restored all states from the checkpoint" in logs, "the requeued job resumed from last.ckpt")
check(not (job / "checkpoints" / "resume.json").exists(), "resume.json removed once the run ended")
ours = weights(job / "checkpoints" / "last.ckpt")
theirs = weights(work / "runs" / "straight" / "straight" / "checkpoints" / "last.ckpt")
same = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
check(same, f"final weights bitwise equal to the uninterrupted run ({len(ours)} tensors)")
print("local_cluster.sh:", "all checks passed" if not failed else f"{len(failed)} check(s) failed")
sys.exit(1 if failed else 0)
EOF
