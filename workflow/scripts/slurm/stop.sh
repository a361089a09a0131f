#!/usr/bin/env bash
# Stop the throwaway Slurm cluster that start.sh started with the same --state folder: each daemon by
# the pid in its pid file under that folder (never by name), jobs first, then the configuration files
# start.sh wrote to /etc/slurm. Safe to run twice, or after a start that failed half way.
#
#   workflow/scripts/slurm/stop.sh --state DIR
set -uo pipefail

STATE=""
while [ $# -gt 0 ]; do
  case "$1" in
    --state) STATE=$2; shift 2 ;;
    -h|--help) sed -n '2,6p' "$0"; exit 0 ;;
    *) echo "stop.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
[ -n "$STATE" ] || { echo "stop.sh: --state DIR is required" >&2; exit 2; }
[ -d "$STATE" ] || exit 0
STATE=$(cd "$STATE" && pwd)
[ -f "$STATE/.attnbench-slurm" ] || { echo "stop.sh: $STATE is not a folder start.sh made" >&2; exit 2; }
MARK="# attnbench throwaway cluster: written by workflow/scripts/slurm/start.sh"

# Running jobs first, so that no slurmstepd outlives its slurmd (bounded: the controller may be gone).
if [ -f "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; then
  timeout 10 scancel --full --signal=KILL --state=RUNNING --user=root >/dev/null 2>&1
  timeout 10 scancel --user=root >/dev/null 2>&1
  for _ in $(seq 1 30); do
    [ -z "$(timeout 5 squeue -h -t RUNNING,COMPLETING -o %i 2>/dev/null)" ] && break
    sleep 0.5
  done
fi

# stop_pid NAME PIDFILE: SIGTERM, up to 10 s, then SIGKILL.
stop_pid() {
  local name=$1 file=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file" 2>/dev/null)
  case "$pid" in ''|*[!0-9]*) rm -f "$file"; return 0 ;; esac
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then
      echo "stop.sh: $name ($pid) ignored SIGTERM; killing it" >&2
      kill -KILL "$pid" 2>/dev/null
    fi
  fi
  rm -f "$file"
}

# The job steps' slurmstepd processes belong to the node daemons' jobs; any left are orphans of ours.
for f in "$STATE"/slurmd-*.pid; do [ -e "$f" ] && stop_pid "slurmd $(basename "$f" .pid)" "$f"; done
stop_pid slurmctld "$STATE/slurmctld.pid"
stop_pid slurmdbd "$STATE/slurmdbd.pid"
stop_pid mariadbd "$STATE/mariadbd.pid"
stop_pid munged "$STATE/munged.pid"
if [ -f "$STATE/munge-run-dir" ]; then
  case "$(cat "$STATE/munge-run-dir")" in /run/munge/attnbench-*) rm -rf "$(cat "$STATE/munge-run-dir")" ;; esac
  rm -f "$STATE/munge-run-dir"
fi

for f in /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/slurmdbd.conf; do
  if [ -f "$f" ] && grep -qF "$MARK (state: $STATE)" "$f"; then rm -f "$f"; fi
done
echo "Slurm cluster in $STATE stopped"
