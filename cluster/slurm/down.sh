#!/usr/bin/env bash
# Stop the daemons cluster/slurm/up.sh started (recorded under $MTAD_SLURM_STATE/started/), and
# only those: a daemon it found running is left alone. Idempotent; configuration, accounting
# database and packages stay (make slurm-up starts them again in seconds).
set -euo pipefail
STATE=${MTAD_SLURM_STATE:-/var/lib/mtad-slurm}
say() { printf 'slurm-down: %s\n' "$*"; }
T0=$(date +%s.%N)
stopped=0
# slurmd first (its jobs end with it), the database last
for name in slurmd slurmctld slurmdbd mariadbd munged; do
  rec="$STATE/started/$name"
  [ -f "$rec" ] || continue
  pid=$(cat "$rec")
  # the recorded pid is ours only while it still runs that program (pids are reused)
  if [ -n "$pid" ] && [ "$(cat /proc/"$pid"/comm 2>/dev/null)" = "$name" ]; then
    kill -TERM "$pid"
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid"; say "$name (pid $pid) killed after 10 s"; else say "stopped $name (pid $pid)"; fi
    stopped=$((stopped + 1))
  else
    say "$name (pid $pid) was not running"
  fi
  rm -f "$rec"
done
say "$stopped daemons stopped in $(python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.1f} s')" "$T0")"
