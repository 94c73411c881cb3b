#!/usr/bin/env bash
# Start/stop a throw-away single-node Slurm cluster (munged + slurmctld + slurmd
# [+ mariadbd + slurmdbd]) entirely under one directory: no systemd, no cgroups,
# nothing written to /etc or /run.
#
#   slurm_local.sh start [DIR]   -> prints "export SLURM_CONF=DIR/etc/slurm.conf"
#   slurm_local.sh stop  [DIR]   -> kills exactly the PIDs recorded in DIR/run/*.pid
#
# Env knobs: SLURM_CTLD_PORT (default 6817), SLURM_D_PORT (6818), SLURM_NODE_MEM (MiB),
#            SLURM_WITH_DBD=1 -> also start mariadbd + slurmdbd so that sacct works
#            (ports SLURM_DBD_PORT=6819, SLURM_MYSQL_PORT=16819)
#            SLURM_CRED_EXPIRE (s, default Slurm's 120): also how long a requeued job waits before it may start again
#            SLURM_SCHED_PARAMS: a SchedulerParameters= value (e.g. sched_interval=2) for a faster test cluster
#
# Vendored from the project's shared tools (docs: the SLURM test fixture in tests/test_sweeps_slurm.py); the two
# knobs above were added for the requeue test.
set -euo pipefail

cmd=${1:?usage: $0 start|stop [DIR]}
D=$(readlink -m "${2:?usage: $0 start|stop DIR}")
HOST=$(hostname -s)
USER_NAME=$(id -un)
CTLD_PORT=${SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_D_PORT:-6818}
WITH_DBD=${SLURM_WITH_DBD:-0}
DBD_PORT=${SLURM_DBD_PORT:-6819}
MYSQL_PORT=${SLURM_MYSQL_PORT:-16819}
NCPU=$(nproc)
# RealMemory a bit under the machine's (MemTotal in MiB minus ~10%)
MEM=${SLURM_NODE_MEM:-$(awk '/MemTotal/ {printf "%d", $2/1024*0.9}' /proc/meminfo)}
CRED_EXPIRE=${SLURM_CRED_EXPIRE:+,cred_expire=$SLURM_CRED_EXPIRE}
SCHED_LINE=${SLURM_SCHED_PARAMS:+SchedulerParameters=$SLURM_SCHED_PARAMS}

stop_pidfile() {  # kill only the PID recorded by our own daemon, then wait for it
  local f=$1 pid
  [[ -s $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$pid" 2>/dev/null; then echo "force-killing $pid ($f)"; kill -KILL "$pid"; fi
  fi
  rm -f "$f"
}

if [[ $cmd == stop ]]; then
  stop_pidfile "$D/run/slurmd.pid"
  stop_pidfile "$D/run/slurmctld.pid"
  stop_pidfile "$D/run/slurmdbd.pid"
  stop_pidfile "$D/run/mariadbd.pid"
  stop_pidfile "$D/run/munged.pid"
  echo "stopped cluster in $D"
  exit 0
fi
[[ $cmd == start ]] || { echo "unknown command $cmd" >&2; exit 2; }

mkdir -p "$D"/{etc,run,log,state,spool/slurmd-"$HOST",munge}
# munged: the socket dir must be o+x and not group/other-writable; key file 0400
chmod 755 "$D/munge"

# ---- munge: private key + private socket, nothing in /etc or /run ---------------
if [[ ! -s $D/munge/munge.key ]]; then
  dd if=/dev/urandom of="$D/munge/munge.key" bs=1 count=1024 status=none
  chmod 400 "$D/munge/munge.key"
fi
MUNGE_SOCK=$D/munge/munge.socket
munged --key-file="$D/munge/munge.key" --socket="$MUNGE_SOCK" \
       --pid-file="$D/run/munged.pid" --log-file="$D/log/munged.log" \
       --seed-file="$D/munge/munged.seed" ${MUNGED_EXTRA:-}
for _ in $(seq 1 50); do [[ -S $MUNGE_SOCK ]] && break; sleep 0.1; done

# ---- optional accounting: private MariaDB + slurmdbd -----------------------------
if [[ $WITH_DBD == 1 ]]; then
  if [[ ! -d $D/mysql/mysql ]]; then   # ~5 s; could be cached/copied from a template dir
    mariadb-install-db --no-defaults --datadir="$D/mysql" --user="$USER_NAME" \
      --auth-root-authentication-method=normal --skip-test-db > "$D/log/mariadb-install.log" 2>&1
  fi
  setsid mariadbd --no-defaults --datadir="$D/mysql" --socket="$D/run/mysqld.sock" \
    --port="$MYSQL_PORT" --bind-address=127.0.0.1 --skip-name-resolve \
    --pid-file="$D/run/mariadbd.pid" --user="$USER_NAME" --log-error="$D/log/mariadb.log" \
    --innodb-buffer-pool-size=64M </dev/null >/dev/null 2>&1 &
  for _ in $(seq 1 100); do [[ -S $D/run/mysqld.sock ]] && break; sleep 0.1; done
  mariadb --no-defaults -S "$D/run/mysqld.sock" -u root -e \
    "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurmpw';
     GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';"
  cat > "$D/etc/slurmdbd.conf" <<DBDCONF
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCK
DbdHost=$HOST
DbdPort=$DBD_PORT
SlurmUser=$USER_NAME
PidFile=$D/run/slurmdbd.pid
LogFile=$D/log/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=slurmpw
StorageLoc=slurm_acct_db
DBDCONF
  chmod 600 "$D/etc/slurmdbd.conf"     # slurmdbd refuses a group/world-readable conf
  ACCT_LINES="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=$HOST
AccountingStoragePort=$DBD_PORT
AccountingStoragePass=$MUNGE_SOCK"   # for accounting_storage/slurmdbd this is the munge socket (AuthInfo is not used)
else
  ACCT_LINES="AccountingStorageType=accounting_storage/none"
fi

# ---- slurm.conf -------------------------------------------------------------------
cat > "$D/etc/slurm.conf" <<EOF
ClusterName=localcluster
SlurmctldHost=$HOST
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK$CRED_EXPIRE
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
$ACCT_LINES
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
SchedulerType=sched/builtin
$SCHED_LINE
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$D/etc/plugstack.conf
MinJobAge=600
KillWait=5
InactiveLimit=0
Waittime=0
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=$NCPU RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=$HOST Default=YES MaxTime=INFINITE State=UP DefMemPerCPU=1000
EOF
: > "$D/etc/plugstack.conf"      # empty; avoids picking up /etc/slurm/plugstack.conf
export SLURM_CONF=$D/etc/slurm.conf

# ---- daemons (they daemonize themselves and write their pid files) -------------
if [[ $WITH_DBD == 1 ]]; then
  slurmdbd         # reads slurmdbd.conf from the directory of $SLURM_CONF
  for _ in $(seq 1 100); do (exec 3<>/dev/tcp/127.0.0.1/"$DBD_PORT") 2>/dev/null && break; sleep 0.1; done
fi
slurmctld -i     # -i: ignore/clear stale state from a previous run in the same dir
slurmd
# wait until the node is schedulable
st=
for _ in $(seq 1 100); do
  kill -0 "$(cat "$D/run/slurmctld.pid" 2>/dev/null || echo 0)" 2>/dev/null || { echo "slurmctld died; see $D/log/slurmctld.log" >&2; exit 1; }
  st=$(timeout 5 sinfo -h -N -o '%t' 2>/dev/null | head -1 || true)
  [[ $st == idle* ]] && break
  sleep 0.1
done
[[ $st == idle* ]] || { echo "node not idle (state='$st'); see $D/log" >&2; exit 1; }
echo "export SLURM_CONF=$SLURM_CONF"
