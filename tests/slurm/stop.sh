#!/usr/bin/env bash
# Stops what tests/slurm/start.sh DIR started (slurmd, slurmctld, munged and any job step still
# running under them) and removes DIR. Safe to run twice, or on a half-started DIR.
# Usage: tests/slurm/stop.sh DIR
set -uo pipefail

dir=${1:?usage: tests/slurm/stop.sh DIR}
[[ -d $dir ]] || exit 0

# Ends the processes whose pids are in FILES, all at once: SIGTERM, then SIGKILL after 5 s.
stop_pids_in() {
  local file pid pids=() left
  for file in "$@"; do
    [[ -s $file ]] || continue
    pid=$(cat "$file")
    [[ $pid =~ ^[0-9]+$ ]] && kill -TERM "$pid" 2>/dev/null && pids+=("$pid")
  done
  for _ in $(seq 50); do
    left=0
    for pid in "${pids[@]}"; do
      # Gone, or a zombie of ours: done.
      kill -0 "$pid" 2>/dev/null && ! grep -q '^State:.*Z' "/proc/$pid/status" 2>/dev/null &&
        left=1
    done
    ((left)) || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
}

# Jobs first, through Slurm (KillWait=2: their tasks get SIGTERM, then SIGKILL 2 s later).
if [[ -s $dir/slurmctld.daemon ]] && kill -0 "$(cat "$dir/slurmctld.daemon")" 2>/dev/null; then
  export SLURM_CONF=$dir/etc/slurm.conf PATH=$PATH:/usr/sbin
  jobs=$(timeout 10 squeue -h -o %i 2>/dev/null)
  if [[ -n $jobs ]]; then
    # shellcheck disable=SC2086
    timeout 10 scancel $jobs 2>/dev/null
    for _ in $(seq 100); do
      [[ -z $(timeout 10 squeue -h -o %i 2>/dev/null) ]] && break
      sleep 0.1
    done
  fi
fi
stop_pids_in "$dir/slurmd.daemon" "$dir/slurmctld.daemon"
# What a job left behind: this cluster's slurmstepd processes (their environment names its
# slurm.conf) and everything under them.
descendants() {
  local p
  grep -l "^PPid:[[:space:]]*$1\$" /proc/[0-9]*/status 2>/dev/null | while read -r p; do
    p=${p#/proc/}
    p=${p%/status}
    echo "$p"
    descendants "$p"
  done
}
for p in /proc/[0-9]*; do
  [[ $(cat "$p/comm" 2>/dev/null) == slurmstepd ]] || continue
  tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -xF "SLURM_CONF=$dir/etc/slurm.conf" > /dev/null || continue
  pid=${p#/proc/}
  # shellcheck disable=SC2046
  kill -KILL "$pid" $(descendants "$pid") 2>/dev/null
done
stop_pids_in "$dir/munge/munged.pid"
rm -rf "$dir"
