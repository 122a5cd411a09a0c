#!/usr/bin/env bash
# Starts a private one-node Slurm cluster (Debian's slurm-wlm 22.05 and munge) for the tests, as
# root, from nothing: its own munge key and munged (run as user munge, on a socket of its own), its
# own slurm.conf, state and spool folders, and free ports, all under DIR; nothing in /etc or /run
# is changed, so several can run at once beside a system Slurm. The daemons talk over
# 127.0.0.1; the node is named `hostname -s`, which must resolve for troupe's rendezvous (srun
# tasks meet on their first node by name).
#
# Usage: tests/slurm/start.sh DIR    (DIR must not exist or be empty; tests/slurm/stop.sh DIR ends it)
# On success DIR/env holds `export SLURM_CONF=...` for clients (srun, sbatch, sinfo), and
# `srun -n 2 hostname` works within 30 s of the start. On failure it says why, prints the daemons'
# logs, stops what it started and exits non-zero; a missing Slurm or munge is a failure, never a
# skip.
set -euo pipefail

dir=${1:?usage: tests/slurm/start.sh DIR}
here=$(cd "$(dirname "$0")" && pwd)

fail() {
  echo "tests/slurm/start.sh: $*" >&2
  for log in "$dir"/log/*.log "$dir"/munge/munged.log; do
    [[ -s $log ]] && { echo "--- $log" >&2; tail -n 30 "$log" >&2; }
  done
  bash "$here/stop.sh" "$dir" || true
  exit 1
}

[[ $(id -u) -eq 0 ]] || { echo "tests/slurm/start.sh: must run as root (SlurmUser=root)" >&2; exit 1; }
for tool in munged slurmctld slurmd srun scontrol sinfo; do
  command -v "$tool" >/dev/null || PATH=$PATH:/usr/sbin command -v "$tool" >/dev/null || {
    echo "tests/slurm/start.sh: $tool is not installed; run scripts/setup.sh (it installs" \
      "Debian's slurm-wlm and munge)" >&2
    exit 1
  }
done
export PATH=$PATH:/usr/sbin
id munge >/dev/null 2>&1 || { echo "tests/slurm/start.sh: no user munge (install munge)" >&2; exit 1; }

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
[[ -z $(ls -A "$dir") ]] || { echo "tests/slurm/start.sh: $dir is not empty" >&2; exit 1; }
# munged (user munge) must reach its folder: every folder above it must be searchable.
chmod 755 "$dir"
mkdir -p "$dir"/{etc,state,spool,log,tmp,munge}
chown munge:munge "$dir/munge"
chmod 711 "$dir/munge"  # clients reach the socket; only munge lists or writes

# munge: a fresh key, a private socket.
dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
chown munge:munge "$dir/munge/munge.key"
chmod 400 "$dir/munge/munge.key"
socket=$dir/munge/munge.socket
runuser -u munge -- munged --socket="$socket" --key-file="$dir/munge/munge.key" \
  --pid-file="$dir/munge/munged.pid" --log-file="$dir/munge/munged.log" \
  --seed-file="$dir/munge/munged.seed" || fail "munged did not start"
for _ in $(seq 100); do [[ -S $socket ]] && break; sleep 0.05; done
[[ -S $socket ]] || fail "munged made no socket $socket within 5 s"

# Two ports nobody listens on, taken from the range Linux does not hand out on its own.
free_port() {
  local p
  for _ in $(seq 200); do
    p=$((20000 + RANDOM % 12000))
    [[ -z $(ss -Hltn "sport = :$p") ]] && { echo "$p"; return; }
  done
  fail "no free port found"
}
ctld_port=$(free_port)
slurmd_port=$(free_port)
while [[ $slurmd_port == "$ctld_port" ]]; do slurmd_port=$(free_port); done

host=$(hostname -s)
cat >"$dir/etc/slurm.conf" <<EOF
ClusterName=troupe
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
TmpFS=$dir/tmp
PlugStackConfig=$dir/etc/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/builtin
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=2
MessageTimeout=10
InactiveLimit=0
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=troupe Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
: >"$dir/etc/plugstack.conf"
echo "export SLURM_CONF=$dir/etc/slurm.conf" >"$dir/env"
export SLURM_CONF=$dir/etc/slurm.conf

# In the background, in the foreground of their own (-D): stop.sh ends them by these pids.
setsid slurmctld -D -i -f "$SLURM_CONF" >"$dir/log/slurmctld.out" 2>&1 </dev/null &
echo $! >"$dir/slurmctld.daemon"
setsid slurmd -D -f "$SLURM_CONF" -N "$host" >"$dir/log/slurmd.out" 2>&1 </dev/null &
echo $! >"$dir/slurmd.daemon"

# Ready once the node is idle: then a step starts at once.
state=
for _ in $(seq 300); do
  state=$(sinfo -h -N -n "$host" -o %t 2>/dev/null || true)
  [[ $state == idle* ]] && break
  kill -0 "$(cat "$dir/slurmctld.daemon")" 2>/dev/null || fail "slurmctld exited"
  kill -0 "$(cat "$dir/slurmd.daemon")" 2>/dev/null || fail "slurmd exited"
  sleep 0.1
done
[[ $state == idle* ]] || fail "node $host not idle within 30 s (state '${state:-unknown}')"
out=$(timeout 30 srun -n 2 hostname 2>&1) || fail "srun -n 2 hostname failed: $out"
[[ $(grep -c . <<<"$out") == 2 ]] || fail "srun -n 2 hostname printed: $out"
echo "tests/slurm/start.sh: Slurm up in $dir (slurmctld port $ctld_port, slurmd port $slurmd_port)"
