#!/usr/bin/env bash
# Start a throwaway Slurm cluster on this machine (root, Debian, no systemd): munged, slurmctld and
# one slurmd per emulated node, optionally slurmdbd + MariaDB for accounting (sacct), optionally
# fake GPUs (a `gpu` GRES on character devices, so Slurm sets CUDA_VISIBLE_DEVICES per task).
# Every daemon writes its pid file under the state folder; stop.sh stops exactly those pids.
#
#   workflow/scripts/slurm/start.sh --state DIR [--nodes N] [--gpus G] [--accounting]
#                                   [--cpus C] [--mem-mb M] [--install]
#
#   --nodes N       emulated nodes n1..nN (several slurmd on this host, distinct ports); default 1,
#                   which names the node after this host
#   --gpus G        fake GPUs per node (GRES gpu:G on mknod'ed character devices); default 0
#   --accounting    also slurmdbd + MariaDB: sacct works, account `attnbench` exists
#   --cpus/--mem-mb what each node declares (default: what `slurmd -C` reports, memory minus 1 GiB)
#   --install       apt-get install the Debian packages that are missing first
#
# The cluster's configuration is written to /etc/slurm/ (where every Slurm command, including the
# srun inside a job, looks for it), marked as ours; an existing configuration that is not ours is
# never overwritten. Partitions: `debug` (default) and `attnbench` (not default), both on all nodes.
set -euo pipefail

STATE="" NODES=1 GPUS=0 ACCOUNTING=0 CPUS="" MEM_MB="" INSTALL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --state) STATE=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --gpus) GPUS=$2; shift 2 ;;
    --accounting) ACCOUNTING=1; shift ;;
    --cpus) CPUS=$2; shift 2 ;;
    --mem-mb) MEM_MB=$2; shift 2 ;;
    --install) INSTALL=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "start.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$STATE" ] || { echo "start.sh: --state DIR is required" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "start.sh: needs root (daemons, /etc/slurm, mknod)" >&2; exit 2; }
case "$NODES$GPUS" in *[!0-9]*) echo "start.sh: --nodes and --gpus take integers" >&2; exit 2 ;; esac
[ "$NODES" -ge 1 ] || { echo "start.sh: --nodes must be >= 1" >&2; exit 2; }

HERE=$(cd "$(dirname "$0")" && pwd)
MARK="# attnbench throwaway cluster: written by workflow/scripts/slurm/start.sh"
PACKAGES="munge slurmctld slurmd slurm-client"
[ "$ACCOUNTING" = 1 ] && PACKAGES="$PACKAGES slurmdbd mariadb-server"

missing=""
for p in $PACKAGES; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing="$missing $p"; done
if [ -n "$missing" ]; then
  if [ "$INSTALL" = 1 ]; then
    DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends $missing >/dev/null \
      || { DEBIAN_FRONTEND=noninteractive timeout 300 apt-get update -q >/dev/null &&
           DEBIAN_FRONTEND=noninteractive timeout 600 apt-get install -y -q --no-install-recommends $missing >/dev/null; }
  else
    echo "start.sh: missing Debian packages:$missing (apt-get install --no-install-recommends$missing, or --install)" >&2
    exit 3
  fi
fi

for f in /etc/slurm/slurm.conf /etc/slurm/gres.conf /etc/slurm/slurmdbd.conf; do
  if [ -e "$f" ] && ! grep -qF "$MARK" "$f"; then
    echo "start.sh: $f exists and was not written by this script; refusing to replace a real configuration" >&2
    exit 4
  fi
done
if pgrep -x slurmctld >/dev/null || pgrep -x slurmd >/dev/null; then
  echo "start.sh: Slurm daemons are already running here (pids: $(pgrep -x 'slurmctld|slurmd' | tr '\n' ' ')); stop them first" >&2
  exit 4
fi

mkdir -p "$STATE"
STATE=$(cd "$STATE" && pwd)
echo "$STATE" > "$STATE/.attnbench-slurm"   # stop.sh refuses folders without this marker
HOST=$(hostname -s)

# wait_for SECONDS DESCRIPTION COMMAND...: poll until COMMAND succeeds.
wait_for() {
  local limit=$1 what=$2; shift 2
  local end=$(( $(date +%s) + limit ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$end" ]; then
      echo "start.sh: $what did not come up within ${limit}s; logs in $STATE" >&2
      "$HERE/stop.sh" --state "$STATE" >&2 || true
      exit 5
    fi
    sleep 0.5
  done
}

# --- munge: reuse a working daemon on the default socket, else start our own ---------------------
if ! (munge -n </dev/null | unmunge) >/dev/null 2>&1; then
  install -d -o munge -g munge -m 0755 /run/munge
  # munged refuses files under folders its user cannot reach (pytest's tmp is root-only): /run/munge.
  MUNGE_RUN=/run/munge/attnbench-$(echo "$STATE" | md5sum | cut -c1-12)
  install -d -o munge -g munge -m 0700 "$MUNGE_RUN"
  [ -s /etc/munge/munge.key ] || { runuser -u munge -- mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null \
                                   || dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
  chown munge:munge /etc/munge/munge.key && chmod 0400 /etc/munge/munge.key
  runuser -u munge -- munged --pid-file="$MUNGE_RUN/munged.pid" --log-file="$MUNGE_RUN/munged.log" \
    --seed-file="$MUNGE_RUN/munged.seed"
  wait_for 20 munged sh -c 'munge -n </dev/null | unmunge'
  cp "$MUNGE_RUN/munged.pid" "$STATE/munged.pid"
  echo "$MUNGE_RUN" > "$STATE/munge-run-dir"
fi

# --- nodes ----------------------------------------------------------------------------------------
# `slurmd -C`: NodeName=vm CPUs=2 Boards=1 SocketsPerBoard=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=24105
HW=$(slurmd -C | head -n 1)
field() { echo "$HW" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
if [ -z "$CPUS" ]; then
  CPUS=$(field CPUs)
  TOPO="Boards=$(field Boards) SocketsPerBoard=$(field SocketsPerBoard) CoresPerSocket=$(field CoresPerSocket) ThreadsPerCore=$(field ThreadsPerCore)"
else
  TOPO="Boards=1 SocketsPerBoard=1 CoresPerSocket=$CPUS ThreadsPerCore=1"
fi
[ -n "$MEM_MB" ] || MEM_MB=$(( $(field RealMemory) - 1024 ))

if [ "$NODES" = 1 ]; then NAMES=$HOST; else NAMES=$(seq -f 'n%g' 1 "$NODES" | tr '\n' ' '); fi

GRES_LINE="" ; : > "$STATE/gres.conf.body"
if [ "$GPUS" -gt 0 ]; then
  GRES_LINE="Gres=gpu:$GPUS"
  mkdir -p "$STATE/dev"
  for n in $NAMES; do
    for i in $(seq 0 $(( GPUS - 1 ))); do
      # A character device with /dev/null's numbers: Slurm only needs a device file to hand out.
      [ -e "$STATE/dev/$n-gpu$i" ] || mknod "$STATE/dev/$n-gpu$i" c 1 3
    done
    echo "NodeName=$n Name=gpu File=$STATE/dev/$n-gpu[0-$(( GPUS - 1 ))]" >> "$STATE/gres.conf.body"
  done
fi

if [ "$ACCOUNTING" = 1 ]; then
  ACCT="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
AccountingStorageEnforce=associations
AccountingStorageTRES=gres/gpu
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=30"
else
  ACCT="AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none"
fi

mkdir -p /etc/slurm "$STATE/ctld"
{
  echo "$MARK (state: $STATE)"
  cat <<EOF
ClusterName=attnbench
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool-%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
# No usable cgroups in containers: track processes through /proc, bind tasks with sched_setaffinity.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SlurmdParameters=config_overrides
MpiDefault=none
GresTypes=gpu
# Finished jobs stay visible to squeue for an hour (the Snakemake plugin's status checks need it).
MinJobAge=3600
ReturnToService=2
KillWait=5
InactiveLimit=0
SlurmdTimeout=120
$ACCT
# Finished jobs also go to a text file: sacct -c reads it without slurmdbd.
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
EOF
  port=17001
  for n in $NAMES; do
    echo "NodeName=$n NodeHostname=$HOST NodeAddr=127.0.0.1 Port=$port CPUs=$CPUS $TOPO RealMemory=$MEM_MB $GRES_LINE State=UNKNOWN"
    port=$(( port + 1 ))
  done
  ALL=$(echo $NAMES | tr ' ' ',')
  echo "PartitionName=debug Nodes=$ALL Default=YES MaxTime=INFINITE State=UP"
  echo "PartitionName=attnbench Nodes=$ALL Default=NO MaxTime=INFINITE State=UP"
} > /etc/slurm/slurm.conf
{ echo "$MARK (state: $STATE)"; echo "AutoDetect=off"; cat "$STATE/gres.conf.body"; } > /etc/slurm/gres.conf
rm -f "$STATE/gres.conf.body"

# --- accounting: MariaDB + slurmdbd ---------------------------------------------------------------
if [ "$ACCOUNTING" = 1 ]; then
  DB="$STATE/mysql"
  # As root: the state folder may sit where the mysql user cannot go (pytest's tmp is root-only).
  mkdir -p "$DB" "$STATE/mysql-run"
  mariadb-install-db --user=root --datadir="$DB" --auth-root-authentication-method=socket >"$STATE/mariadb-install.log" 2>&1
  mariadbd --user=root --datadir="$DB" --socket="$STATE/mysql-run/mysqld.sock" \
    --pid-file="$STATE/mysql-run/mariadbd.pid" --skip-networking=0 --bind-address=127.0.0.1 --port=3307 \
    --log-error="$STATE/mariadbd.log" --innodb-buffer-pool-size=64M >/dev/null 2>&1 &
  wait_for 60 mariadbd mariadb --socket="$STATE/mysql-run/mysqld.sock" -e 'select 1'
  cp "$STATE/mysql-run/mariadbd.pid" "$STATE/mariadbd.pid"
  mariadb --socket="$STATE/mysql-run/mysqld.sock" -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'attnbench';
    GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
  { echo "$MARK (state: $STATE)"; cat <<EOF
AuthType=auth/munge
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=root
PidFile=$STATE/slurmdbd.pid
LogFile=$STATE/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3307
StorageLoc=slurm_acct_db
StorageUser=slurm
StoragePass=attnbench
EOF
  } > /etc/slurm/slurmdbd.conf
  chmod 600 /etc/slurm/slurmdbd.conf
  slurmdbd
  wait_for 60 slurmdbd sacctmgr -n list cluster
  sacctmgr -i add cluster attnbench >/dev/null
  sacctmgr -i add account attnbench Description=attnbench Organization=attnbench >/dev/null
  sacctmgr -i add user root Account=attnbench DefaultAccount=attnbench >/dev/null
fi

# --- controller and node daemons ------------------------------------------------------------------
slurmctld
wait_for 30 slurmctld scontrol ping
for n in $NAMES; do slurmd -N "$n"; done
# A node is usable once it reports idle (ReturnToService=2 brings it up on registration).
all_idle() { [ "$(sinfo -h -p debug -t idle -o '%D' | awk '{s+=$1} END {print s+0}')" -ge "$NODES" ]; }
wait_for 60 "the nodes ($NAMES)" all_idle

echo "Slurm cluster up: nodes $NAMES, $CPUS CPUs and $MEM_MB MB each$( [ "$GPUS" -gt 0 ] && echo ", $GPUS fake GPUs each"),"\
     "accounting $( [ "$ACCOUNTING" = 1 ] && echo slurmdbd || echo none); state in $STATE; stop with" \
     "$HERE/stop.sh --state $STATE"
