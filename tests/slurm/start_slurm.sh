#!/usr/bin/env bash
# Copied from the team's shared development tools (tools/start_slurm.sh, with its README's
# lessons on the Snakemake SLURM plugin) so that tests/test_slurm.py needs nothing outside
# this repository. One change: SLURM_MEMORY_KILL (below), so that a test can see a job
# killed for exceeding its memory and retried with more.
# start_slurm.sh - install and start a single-node SLURM cluster inside a root
# container without systemd (Debian 12 packages: slurm 22.05, munge 0.5.15,
# optionally slurmdbd + MariaDB so that `sacct` works).
#
# Idempotent: re-running while the cluster is up (and the config unchanged)
# only re-checks it. `start_slurm.sh stop` stops every daemon via its pid file.
#
# Usage: start_slurm.sh [start|stop|status]
# Env:
#   SLURM_CI_DIR        state + logs (default /tmp/ci-slurm)
#   SLURM_WITH_DBD      1: slurmdbd + MariaDB, sacct works (default)
#                       0: no accounting (sacct fails; use squeue for status)
#   SLURM_FAKE_GPUS     number of fake GPUs (gres/gpu on /dev/null links), 0 = none (default 1)
#   SLURM_FAKE_GPU_TYPE optional GPU type/model name for them (e.g. a100), default untyped
#   SLURM_PARTITION     partition name (default debug)
#   SLURM_CLUSTER_NAME  cluster name (default snakeci)
#   SLURM_ACCOUNT_NAME  accounting account for root (default ci; only with DBD)
#   SLURM_MEMORY_KILL   1: kill a job step using more memory than it asked for, polled every
#                       second (JobAcctGatherParams=OverMemoryKill; only with DBD; there is
#                       no cgroup here); 0 = no enforcement (default)
set -euo pipefail

ACTION=${1:-start}
CI_DIR=${SLURM_CI_DIR:-/tmp/ci-slurm}
WITH_DBD=${SLURM_WITH_DBD:-1}
FAKE_GPUS=${SLURM_FAKE_GPUS:-1}
FAKE_GPU_TYPE=${SLURM_FAKE_GPU_TYPE:-}
PARTITION=${SLURM_PARTITION:-debug}
CLUSTER=${SLURM_CLUSTER_NAME:-snakeci}
ACCOUNT=${SLURM_ACCOUNT_NAME:-ci}
MEMORY_KILL=${SLURM_MEMORY_KILL:-0}
STATE=$CI_DIR/state
LOG=$CI_DIR/log
CONF=/etc/slurm/slurm.conf
DBD_CONF=/etc/slurm/slurmdbd.conf
GRES_CONF=/etc/slurm/gres.conf
MYSQL_PID=/run/mysqld/mysqld.pid
MUNGE_PID=/run/munge/munged.pid
export DEBIAN_FRONTEND=noninteractive

log() { echo "[start_slurm] $*" >&2; }
pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
wait_for() { # wait_for SECONDS WHAT CMD...
  local end=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$end" ]; then log "timeout waiting for $what"; return 1; fi
    sleep 0.5
  done
}
stop_pidfile() { # stop_pidfile NAME PIDFILE
  if pid_alive "$2"; then
    local pid; pid=$(cat "$2")
    log "stopping $1 (pid $pid)"
    kill "$pid"
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.25; done
    log "$1 (pid $pid) did not stop on SIGTERM, sending SIGKILL"; kill -9 "$pid" 2>/dev/null || true
  fi
}

do_stop() {
  stop_pidfile slurmd "$STATE/slurmd.pid"
  stop_pidfile slurmctld "$STATE/slurmctld.pid"
  stop_pidfile slurmdbd "$STATE/slurmdbd.pid"
  stop_pidfile mariadbd "$MYSQL_PID"
  stop_pidfile munged "$MUNGE_PID"
}

install_pkgs() {
  local pkgs=(munge slurm-client slurmctld slurmd) missing=()
  [ "$WITH_DBD" = 1 ] && pkgs+=(slurmdbd mariadb-server)
  for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "apt-get install ${missing[*]}"
  # invoke-rc.d cannot start services here (no systemd / policy-rc.d): harmless
  if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LOG/apt.log" 2>&1; then
    apt-get update -q >>"$LOG/apt.log" 2>&1
    apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$LOG/apt.log" 2>&1
  fi
}

write_if_changed() { # write_if_changed DEST MODE < content ; returns 0 if changed
  local tmp; tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; return 1; fi
  install -m "$2" "$tmp" "$1"; rm -f "$tmp"; return 0
}

write_configs() {
  local host hw real mem gres_node="" acct gres_lines="" changed=0
  host=$(hostname -s)
  # e.g. "NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105"
  hw=$(slurmd -C 2>/dev/null | head -n1 || true)
  real=$(sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p' <<<"$hw")
  hw=$(sed -e 's/^NodeName=[^ ]* *//' -e 's/ *RealMemory=[0-9]*//' <<<"$hw")
  [ -n "$hw" ] || hw="CPUs=$(nproc)"
  [ -n "$real" ] || real=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) / 1024 ))
  mem=$(( real * 9 / 10 ))   # leave headroom, slurmd drains the node if RealMemory > actual

  if [ "$WITH_DBD" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobAcctGatherType=jobacct_gather/linux"
    if [ "$MEMORY_KILL" = 1 ]; then
      acct+=$'\n'"JobAcctGatherFrequency=1"$'\n'"JobAcctGatherParams=OverMemoryKill"
    else
      acct+=$'\n'"JobAcctGatherFrequency=30"
    fi
  else
    acct="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.txt"
  fi
  if [ "$FAKE_GPUS" -gt 0 ]; then
    mkdir -p "$CI_DIR/fakegpu"
    # gres files must be char/block devices, else slurmd logs "not a valid character
    # or block device" and leaves CUDA_VISIBLE_DEVICES empty: symlink /dev/null
    for i in $(seq 0 $((FAKE_GPUS - 1))); do ln -sfn /dev/null "$CI_DIR/fakegpu/gpu$i"; done
    gres_node="Gres=gpu:${FAKE_GPU_TYPE:+$FAKE_GPU_TYPE:}$FAKE_GPUS"
    gres_lines="GresTypes=gpu"
    [ "$WITH_DBD" = 1 ] && gres_lines+=$'\n'"AccountingStorageTRES=gres/gpu"
    # a gpu gres without File= is dropped by slurmd ("Removing file-less GPU")
    write_if_changed "$GRES_CONF" 644 <<EOF && changed=1
# fake GPUs for CI: links to /dev/null, no real devices (CUDA_VISIBLE_DEVICES gets set)
NodeName=$host Name=gpu ${FAKE_GPU_TYPE:+Type=$FAKE_GPU_TYPE }File=$CI_DIR/fakegpu/gpu[0-$((FAKE_GPUS - 1))]
EOF
  else
    if [ -f "$GRES_CONF" ]; then rm -f "$GRES_CONF"; changed=1; fi
  fi

  write_if_changed "$CONF" 644 <<EOF && changed=1
# single-node CI cluster, generated by start_slurm.sh
ClusterName=$CLUSTER
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
ReturnToService=2
SlurmctldPort=6817
SlurmdPort=6818
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=500
MinJobAge=300
KillWait=5
MailProg=/bin/true
InactiveLimit=0
$acct
$gres_lines
NodeName=$host NodeAddr=127.0.0.1 $hw RealMemory=$mem $gres_node State=UNKNOWN
PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF

  if [ "$WITH_DBD" = 1 ]; then
    write_if_changed "$DBD_CONF" 600 <<EOF && changed=1
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
LogFile=$LOG/slurmdbd.log
PidFile=$STATE/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass=slurm
StorageLoc=slurm_acct_db
EOF
  fi
  return $(( changed ? 0 : 1 ))
}

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  mkdir -p /run/munge && chown munge:munge /run/munge && chmod 755 /run/munge
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
    wait_for 20 munged sh -c 'munge -n | unmunge'
  fi
}

start_mariadb() {
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld
  if ! mariadb-admin ping >/dev/null 2>&1; then
    [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >>"$LOG/mariadb.log" 2>&1
    log "starting mariadbd"
    # own session so that the caller's process group / job control does not take it down
    setsid -f /usr/sbin/mariadbd --user=mysql --bind-address=127.0.0.1 \
      --pid-file="$MYSQL_PID" --socket=/run/mysqld/mysqld.sock </dev/null >>"$LOG/mariadb.log" 2>&1
    wait_for 60 mariadb mariadb-admin ping
  fi
  mariadb -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'slurm';
              GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost'; FLUSH PRIVILEGES;"
}

start_slurmdbd() {
  if ! pid_alive "$STATE/slurmdbd.pid"; then log "starting slurmdbd"; slurmdbd; fi
  wait_for 60 slurmdbd sacctmgr -n list cluster
  sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" \
    || sacctmgr -i add cluster "$CLUSTER" >/dev/null
  sacctmgr -n -P list account format=account | grep -qx "$ACCOUNT" \
    || sacctmgr -i add account "$ACCOUNT" Description=ci Organization=ci >/dev/null
  [ -n "$(sacctmgr -n -P list assoc user=root account="$ACCOUNT" cluster="$CLUSTER" format=user)" ] \
    || sacctmgr -i add user root Account="$ACCOUNT" DefaultAccount="$ACCOUNT" >/dev/null
}

node_ready() { sinfo -h -N -o %t | grep -Eq '^(idle|mix|alloc)'; }

do_start() {
  [ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
  mkdir -p "$STATE/ctld" "$STATE/d" "$LOG"
  install_pkgs
  if write_configs; then
    log "config written/changed: (re)starting slurm daemons"
    stop_pidfile slurmd "$STATE/slurmd.pid"
    stop_pidfile slurmctld "$STATE/slurmctld.pid"
    stop_pidfile slurmdbd "$STATE/slurmdbd.pid"
  fi
  start_munge
  if [ "$WITH_DBD" = 1 ]; then start_mariadb; start_slurmdbd; fi
  if ! pid_alive "$STATE/slurmctld.pid"; then log "starting slurmctld"; slurmctld; fi
  wait_for 60 slurmctld sh -c 'scontrol ping | grep -q UP'
  if ! pid_alive "$STATE/slurmd.pid"; then log "starting slurmd"; slurmd; fi
  if ! wait_for 30 "node idle" node_ready; then
    scontrol update nodename="$(hostname -s)" state=resume || true
    wait_for 30 "node idle" node_ready || { sinfo -R; exit 1; }
  fi
  timeout 60 srun -t 1 true || { log "smoke job failed"; exit 1; }
  log "slurm $(sinfo -V | awk '{print $2}') up: $(sinfo -h -o '%P %a %D %t %N %G' | head -n1)"
}

case "$ACTION" in
  start) do_start ;;
  stop) do_stop ;;
  status) scontrol ping; sinfo ;;
  *) echo "usage: $0 [start|stop|status]" >&2; exit 2 ;;
esac
