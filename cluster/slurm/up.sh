#!/usr/bin/env bash
# A single-node Slurm with accounting on this machine, from nothing: what a workstation or a
# CI machine can run as root with apt-get (Debian/Ubuntu), without systemd or cgroups.
#
#   cluster/slurm/up.sh      (make slurm-up)     install if missing, configure, start; idempotent
#   cluster/slurm/down.sh    (make slurm-down)   stop the daemons this script started, only those
#
# Packages: slurmctld, slurmd, slurm-client, slurmdbd, munge, mariadb-server. Daemons, started
# directly: munged (as the munge user), mariadbd (accounting database), slurmdbd, slurmctld,
# slurmd. One node (this machine, sized by `slurmd -C`), one partition `debug`, accounting
# through slurmdbd so that `sacct` answers (submitit reads job states with it).
# A daemon already running (e.g. a site's munged) is used and left alone; the ones this script
# starts are recorded under $MTAD_SLURM_STATE/started/ for down.sh. A slurm.conf this script did
# not write means a Slurm is configured here already: refused, nothing touched.
# Configuration: /etc/slurm/{slurm,slurmdbd}.conf (where the clients look); state, logs and pid
# files: $MTAD_SLURM_STATE (default /var/lib/mtad-slurm).
set -euo pipefail

STATE=${MTAD_SLURM_STATE:-/var/lib/mtad-slurm}
ETC=/etc/slurm
MARK="# written by mtad cluster/slurm/up.sh"
PACKAGES=(slurmctld slurmd slurm-client slurmdbd munge mariadb-server)
CLUSTER=mtad
T0=$(date +%s.%N)

say() { printf 'slurm-up: %s\n' "$*"; }
die() { printf 'slurm-up: %s\n' "$*" >&2; exit 2; }
since() { python3 -c "import sys,time; print(f'{time.time()-float(sys.argv[1]):.1f} s')" "$1"; }
# wait_for SECONDS WHAT CMD...: poll CMD every 0.2 s until it succeeds
wait_for() {
  local limit=$1 what=$2; shift 2
  local end=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$end" ] || die "$what did not come up within ${limit} s (logs: $STATE/log/)"
    sleep 0.2
  done
}
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
# started NAME PIDFILE: record that this script started NAME (down.sh stops it)
started() { mkdir -p "$STATE/started"; cp "$2" "$STATE/started/$1"; say "started $1 (pid $(cat "$2"))"; }

[ "$(id -u)" = 0 ] || die "needs root (packages, daemons, /etc/slurm): run it as root, e.g. sudo make slurm-up"

# ---- packages ----
if ! command -v slurmctld >/dev/null || ! command -v slurmdbd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v mariadbd >/dev/null || ! command -v sacct >/dev/null || ! command -v slurmd >/dev/null; then
  command -v apt-get >/dev/null || die "Slurm is not installed and there is no apt-get: install ${PACKAGES[*]} with this system's package manager"
  t=$(date +%s.%N)
  say "installing ${PACKAGES[*]} (apt-get)"
  apt-get update -qq
  # no daemon starts at install time (no init system here; policy-rc.d keeps it so elsewhere)
  DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null
  say "packages installed in $(since "$t")"
fi

# ---- configuration ----
if [ -f "$ETC/slurm.conf" ] && ! grep -qF "$MARK" "$ETC/slurm.conf"; then
  die "$ETC/slurm.conf exists and was not written by this script: a Slurm is configured here already (use it, or move that file away)"
fi
mkdir -p "$ETC" "$STATE"/{log,ctld,spool,run}
host=$(hostname -s)
# this machine as slurmd sees it (CPUs, sockets, cores, RealMemory in MB)
node=$(slurmd -C | head -n 1)
case "$node" in NodeName=*) ;; *) die "slurmd -C did not describe this node: $node" ;; esac
cat > "$ETC/slurm.conf.new" <<CONF
$MARK (a one-node test cluster; docs/cluster.md)
ClusterName=$CLUSTER
SlurmctldHost=$host
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/run/slurmctld.pid
SlurmdPidFile=$STATE/run/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
# no cgroups here: processes tracked by parent id, no task binding, no usage sampling
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
# cores and memory are allocated (not the whole node per job), 1 GB per CPU unless asked
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
# a cancelled job gets SIGKILL 5 s after SIGTERM
KillWait=5
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
JobCompType=jobcomp/none
$node State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
mv "$ETC/slurm.conf.new" "$ETC/slurm.conf"

dbpass_file="$STATE/dbpass"
[ -s "$dbpass_file" ] || { (umask 077; python3 -c "import secrets; print(secrets.token_hex(16))" > "$dbpass_file"); }
dbpass=$(cat "$dbpass_file")
(umask 077; cat > "$ETC/slurmdbd.conf" <<CONF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
PidFile=$STATE/run/slurmdbd.pid
LogFile=$STATE/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=$dbpass
CONF
)
chmod 600 "$ETC/slurmdbd.conf"

# ---- munged ----
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
  if [ ! -s /etc/munge/munge.key ]; then
    mkdir -p /etc/munge
    mungekey --create --keyfile=/etc/munge/munge.key
    chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  runuser -u munge -- munged --pid-file=/run/munge/munged.pid
  wait_for 10 munged sh -c 'munge -n | unmunge'
  started munged /run/munge/munged.pid
else
  say "munged: running"
fi

# ---- mariadbd (the accounting database) ----
if ! mariadb-admin ping >/dev/null 2>&1; then
  mkdir -p /run/mysqld; chown mysql:mysql /run/mysqld
  [ -d /var/lib/mysql/mysql ] || mariadb-install-db --user=mysql --datadir=/var/lib/mysql >"$STATE/log/mariadb-install.log" 2>&1
  setsid nohup mariadbd --user=mysql --pid-file=/run/mysqld/mariadbd.pid >"$STATE/log/mariadbd.log" 2>&1 < /dev/null &
  wait_for 60 mariadbd mariadb-admin ping
  wait_for 10 "mariadbd's pid file" test -s /run/mysqld/mariadbd.pid
  started mariadbd /run/mysqld/mariadbd.pid
else
  say "mariadbd: running"
fi
mariadb <<SQL
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$dbpass';
ALTER USER 'slurm'@'localhost' IDENTIFIED BY '$dbpass';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
SQL

# ---- slurmdbd, slurmctld, slurmd (each daemonizes and writes its pid file) ----
if alive "$STATE/run/slurmdbd.pid"; then say "slurmdbd: running"; else
  slurmdbd
  wait_for 60 slurmdbd sacctmgr -n list cluster
  started slurmdbd "$STATE/run/slurmdbd.pid"
fi
sacctmgr -n -P list cluster format=cluster | grep -qx "$CLUSTER" || sacctmgr -i add cluster "$CLUSTER" >/dev/null
if alive "$STATE/run/slurmctld.pid"; then scontrol reconfigure; say "slurmctld: running (reconfigured)"; else
  slurmctld
  wait_for 60 slurmctld sh -c 'scontrol ping | grep -q UP'
  started slurmctld "$STATE/run/slurmctld.pid"
fi
if alive "$STATE/run/slurmd.pid"; then say "slurmd: running"; else
  slurmd
  wait_for 10 "slurmd's pid file" test -s "$STATE/run/slurmd.pid"
  started slurmd "$STATE/run/slurmd.pid"
fi
node_idle() { [ "$(sinfo -h -n "$host" -o %t | head -n 1)" = idle ]; }
if ! node_idle; then scontrol update nodename="$host" state=resume >/dev/null 2>&1 || true; fi
wait_for 60 "node $host (idle in sinfo)" node_idle
wait_for 30 "sacct" sacct -n -X -S now
say "up in $(since "$T0"): cluster $CLUSTER, node $host, partition debug"
sinfo -o '%P %D %c %m %G %l %t'
