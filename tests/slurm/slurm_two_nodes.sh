#!/usr/bin/env bash
# Start/stop a throw-away two-node Slurm cluster on one machine: slurmctld and munged in the host's network
# namespace, and two slurmd, "nodea" and "nodeb", each in a network namespace of its own, so that the two nodes are
# two hosts on a small network (a bridge in the host namespace, 10.77.N.1; the nodes 10.77.N.2 and 10.77.N.3, each
# on an interface named eth0). Everything else (the file system, the Python environment) is shared, as on a cluster
# with a shared file system. Needs root (network namespaces) and the Debian packages slurmctld slurmd slurm-client
# munge. Based on tests/slurm/slurm_local.sh (the one-node cluster).
#
#   slurm_two_nodes.sh start DIR   -> prints "export SLURM_CONF=DIR/etc/slurm.conf"
#   slurm_two_nodes.sh stop  DIR   -> kills exactly the PIDs recorded in DIR/run/*.pid, removes the namespaces
#
# Env knobs: SLURM_CTLD_PORT (default 6817), SLURM_D_PORT (6818), SLURM_NET (N in 10.77.N.0/24, default 77),
#            SLURM_NODE_CPUS (CPUs per node, default 1), SLURM_NODE_MEM (MiB per node, default 4000).
# A job finds its first node's address with `scontrol show node` (the node names resolve nowhere): see the test.
set -euo pipefail

cmd=${1:?usage: $0 start|stop DIR}
D=$(readlink -m "${2:?usage: $0 start|stop DIR}")
HOST=$(hostname -s)
USER_NAME=$(id -un)
CTLD_PORT=${SLURM_CTLD_PORT:-6817}
SLURMD_PORT=${SLURM_D_PORT:-6818}
NET=${SLURM_NET:-77}
CPUS=${SLURM_NODE_CPUS:-1}
MEM=${SLURM_NODE_MEM:-4000}
TAG=atr$NET                    # names of the namespaces, the bridge and the host ends of the veths (<= 15 chars)
NODES=(nodea nodeb)

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

network_down() {
  for i in 0 1; do
    ip netns delete "$TAG-${NODES[$i]}" 2>/dev/null || true
    ip link delete "$TAG-v$i" 2>/dev/null || true
  done
  ip link delete "$TAG-br" 2>/dev/null || true
}

if [[ $cmd == stop ]]; then
  for node in "${NODES[@]}"; do stop_pidfile "$D/run/slurmd-$node.pid"; done
  stop_pidfile "$D/run/slurmctld.pid"
  stop_pidfile "$D/run/munged.pid"
  network_down
  echo "stopped cluster in $D"
  exit 0
fi
[[ $cmd == start ]] || { echo "unknown command $cmd" >&2; exit 2; }

# ---- the network: a bridge in this namespace, one namespace per node -------------------------------------------
network_down
ip link add "$TAG-br" type bridge
ip addr add "10.77.$NET.1/24" dev "$TAG-br"
ip link set "$TAG-br" up
for i in 0 1; do
  ns=$TAG-${NODES[$i]}
  ip netns add "$ns"
  ip link add "$TAG-v$i" type veth peer name eth0 netns "$ns"
  ip link set "$TAG-v$i" master "$TAG-br" up
  ip -n "$ns" addr add "10.77.$NET.$((i + 2))/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" link set lo up
done

mkdir -p "$D"/{etc,run,log,state,munge}
for node in "${NODES[@]}"; do mkdir -p "$D/spool/slurmd-$node"; done
chmod 755 "$D/munge"   # munged: the socket dir must be o+x and not group/other-writable; key file 0400
if [[ ! -s $D/munge/munge.key ]]; then
  dd if=/dev/urandom of="$D/munge/munge.key" bs=1 count=1024 status=none
  chmod 400 "$D/munge/munge.key"
fi
MUNGE_SOCK=$D/munge/munge.socket   # a file: every namespace reaches it
munged --key-file="$D/munge/munge.key" --socket="$MUNGE_SOCK" --pid-file="$D/run/munged.pid" \
       --log-file="$D/log/munged.log" --seed-file="$D/munge/munged.seed"
for _ in $(seq 1 50); do [[ -S $MUNGE_SOCK ]] && break; sleep 0.1; done

cat > "$D/etc/slurm.conf" <<EOF
ClusterName=twonodes
SlurmctldHost=$HOST(10.77.$NET.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=$USER_NAME
SlurmdUser=$USER_NAME
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCK
MpiDefault=none
SwitchType=switch/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$D/log/jobcomp.txt
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool/slurmd-%n
SlurmctldPidFile=$D/run/slurmctld.pid
SlurmdPidFile=$D/run/slurmd-%n.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
PlugStackConfig=$D/etc/plugstack.conf
MinJobAge=600
KillWait=5
InactiveLimit=0
Waittime=0
NodeName=nodea NodeAddr=10.77.$NET.2 NodeHostname=nodea CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
NodeName=nodeb NodeAddr=10.77.$NET.3 NodeHostname=nodeb CPUs=$CPUS RealMemory=$MEM State=UNKNOWN
PartitionName=debug Nodes=nodea,nodeb Default=YES MaxTime=INFINITE State=UP DefMemPerCPU=1000
EOF
: > "$D/etc/plugstack.conf"      # empty; avoids picking up /etc/slurm/plugstack.conf
export SLURM_CONF=$D/etc/slurm.conf

slurmctld -i     # -i: ignore/clear stale state from a previous run in the same dir
for node in "${NODES[@]}"; do
  # nsenter, not `ip netns exec`: that also remounts /sys, hiding the cgroup file system slurmd reads
  nsenter --net="/run/netns/$TAG-$node" slurmd -N "$node"
done
idle=0
for _ in $(seq 1 150); do
  kill -0 "$(cat "$D/run/slurmctld.pid" 2>/dev/null || echo 0)" 2>/dev/null || { echo "slurmctld died; see $D/log/slurmctld.log" >&2; exit 1; }
  idle=$(timeout 5 sinfo -h -N -o '%t' 2>/dev/null | grep -c '^idle' || true)
  [[ $idle == 2 ]] && break
  sleep 0.2
done
[[ $idle == 2 ]] || { echo "the two nodes are not idle ($(sinfo -h -N -o '%N %t' 2>&1 | tr '\n' ' ')); see $D/log" >&2; exit 1; }
echo "export SLURM_CONF=$SLURM_CONF"
