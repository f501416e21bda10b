#!/usr/bin/env bash
# A single-node Slurm cluster on this machine, for the launcher's tests (tests/test_slurm.py):
#   slurm_test_cluster.sh install     Debian's slurm-wlm and munge (as root, with apt-get), if not installed yet
#   slurm_test_cluster.sh start DIR   munged, slurmctld and slurmd with every file under DIR; prints the line
#                                     SLURM_CONF=DIR/slurm.conf, which sbatch, squeue, scontrol and submitit need
#   slurm_test_cluster.sh stop DIR    stops what start started
# The daemons run as the calling user, on the ports in SLURM_TEST_PORT and SLURM_TEST_PORT + 1 (default 16817),
# with their own munge key and socket: nothing outside DIR is written, no system service is touched.
set -euo pipefail

usage() { echo "usage: $0 install | start DIR | stop DIR" >&2; exit 2; }

daemons=(slurmd slurmctld munged)

stop() {
  local dir=$1 name pid
  for name in "${daemons[@]}"; do
    [[ -f "$dir/$name.pid" ]] || continue
    pid=$(cat "$dir/$name.pid")
    kill "$pid" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$pid" 2>/dev/null || true
  done
}

case "${1:-}" in
  install)
    if command -v sbatch >/dev/null && command -v slurmctld >/dev/null && command -v munged >/dev/null; then
      echo "[slurm] slurm-wlm and munge are installed"; exit 0
    fi
    if [[ $EUID -ne 0 ]] || ! command -v apt-get >/dev/null; then
      echo "[slurm] not installed (needs root and apt-get): the tests against a real Slurm will be skipped"; exit 0
    fi
    echo "[slurm] installing Debian's slurm-wlm and munge"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null \
      || echo "[slurm] the install failed: the tests against a real Slurm will be skipped"
    ;;
  start)
    [[ $# -eq 2 ]] || usage
    dir=$(mkdir -p "$2" && cd "$2" && pwd)
    port=${SLURM_TEST_PORT:-16817}
    node=$(hostname -s)
    mkdir -p "$dir/state" "$dir/spool"
    if [[ ! -f "$dir/munge.key" ]]; then
      head -c 1024 /dev/urandom > "$dir/munge.key"
      chmod 400 "$dir/munge.key"
    fi
    cat > "$dir/slurm.conf" <<EOF
ClusterName=mtsatest
SlurmctldHost=$node
SlurmUser=$(id -un)
SlurmdUser=$(id -un)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket,cred_expire=10
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/builtin
SchedulerParameters=sched_interval=2
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=86400
KillWait=5
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
    stop "$dir"
    munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" --pid-file="$dir/munged.pid" \
      --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"
    export SLURM_CONF="$dir/slurm.conf"
    slurmctld -f "$SLURM_CONF"
    slurmd -f "$SLURM_CONF"
    for _ in $(seq 60); do
      if [[ "$(sinfo --noheader --format %t 2>/dev/null)" == idle ]]; then
        echo "SLURM_CONF=$SLURM_CONF"; exit 0
      fi
      sleep 0.5
    done
    echo "[slurm] the node did not become idle in 30 s (logs in $dir)" >&2
    stop "$dir"; exit 1
    ;;
  stop)
    [[ $# -eq 2 ]] || usage
    stop "$2"
    ;;
  *) usage ;;
esac
