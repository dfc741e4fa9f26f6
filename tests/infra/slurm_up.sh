#!/usr/bin/env bash
# A real SLURM "cluster" of two nodes on this one machine, for the tests (idempotent; run as root).
#
# munged (as the munge user), slurmctld, and one slurmd per node. Each slurmd runs in its own PID,
# UTS (hostname) and mount namespace (unshare), so a job's ranks on node tw2 are invisible from
# tw1 and the other way round: trainwatch on one node must reach the other with `srun --overlap`,
# as on a real cluster. Both nodes share the machine's network (loopback, one port per slurmd).
# No cgroups, no systemd: proctrack/linuxproc, task/none. SLURM 22.05 (Debian bookworm's slurm-wlm).
#
#   tests/infra/slurm_up.sh          start (or check) it; waits until sinfo shows both nodes idle
#   tests/infra/slurm_up.sh down     stop what this script started
set -euo pipefail

NODES=(tw1 tw2)
CONF_DIR=/etc/slurm
STATE=/var/lib/trainwatch-slurm
RUN=/run/trainwatch-slurm
WAIT_S=${SLURM_UP_WAIT_S:-60}

die() { echo "slurm_up: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root (slurmd and munged need it)"
for tool in munged slurmctld slurmd sinfo srun sbatch unshare; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install -y slurm-wlm munge)"
done

pid_alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

down() {
  for node in "${NODES[@]}"; do
    # The namespace's first process (unshare's child): killing it ends everything in the namespace.
    if pid_alive "$RUN/slurmd-$node.unshare.pid"; then
      holder=$(cat "$RUN/slurmd-$node.unshare.pid")
      for init in $(cat "/proc/$holder/task/$holder/children" 2>/dev/null); do kill -KILL "$init" 2>/dev/null || true; done
      kill "$holder" 2>/dev/null || true
    fi
  done
  pid_alive "$RUN/slurmctld.pid" && kill "$(cat "$RUN/slurmctld.pid")" || true
  rm -f "$RUN"/*.pid
}

if [ "${1:-}" = down ]; then down; exit 0; fi

mkdir -p "$CONF_DIR" "$STATE/ctld" "$RUN" /var/log/slurm
for node in "${NODES[@]}"; do mkdir -p "$STATE/slurmd-$node"; done

# munge: a key, then the daemon as the munge user.
if [ ! -s /etc/munge/munge.key ]; then
  mkdir -p /etc/munge
  dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
fi
chown munge:munge /etc/munge/munge.key 2>/dev/null || true
chmod 400 /etc/munge/munge.key
mkdir -p /run/munge /var/lib/munge /var/log/munge
chown munge:munge /run/munge /var/lib/munge /var/log/munge 2>/dev/null || true
if ! munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
  su -s /bin/sh munge -c "munged --force" || die "munged did not start"
  for _ in $(seq 50); do munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
  munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1 || die "munge does not answer"
fi

cpus=$(nproc)
mem=$(( $(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 / 2 ))
conf=$CONF_DIR/slurm.conf
cat > "$conf.new" <<EOF
# Written by tests/infra/slurm_up.sh: two nodes on this machine, for trainwatch's tests.
ClusterName=trainwatch
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmctldPort=6817
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd-%n.log
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
MinJobAge=30
NodeName=tw1 NodeHostname=tw1 NodeAddr=127.0.0.1 Port=6818 CPUs=$cpus RealMemory=$mem State=UNKNOWN
NodeName=tw2 NodeHostname=tw2 NodeAddr=127.0.0.1 Port=6819 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=tw1,tw2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
EOF
if ! cmp -s "$conf.new" "$conf"; then
  mv "$conf.new" "$conf"
  down  # a changed config: start over
else
  rm -f "$conf.new"
fi

if ! pid_alive "$RUN/slurmctld.pid"; then
  slurmctld -i || die "slurmctld did not start: $(tail -5 /var/log/slurm/slurmctld.log 2>/dev/null)"
fi

for node in "${NODES[@]}"; do
  pid_alive "$RUN/slurmd-$node.unshare.pid" && continue
  # Its own PID, UTS and mount namespace (fresh /proc): the node's hostname is its name. The
  # namespace's first process is a shell that waits, reaping what slurmstepd leaves orphaned;
  # --kill-child: killing unshare ends the namespace and everything in it.
  setsid unshare --pid --uts --mount --fork --mount-proc --kill-child \
    sh -c "hostname $node && slurmd -D -N $node & wait" \
    </dev/null >>"/var/log/slurm/slurmd-$node.out" 2>&1 &
  echo $! > "$RUN/slurmd-$node.unshare.pid"
done

deadline=$(( $(date +%s) + WAIT_S ))
while :; do
  states=$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)
  idle=$(echo "$states" | awk '$2 ~ /^(idle|mix|alloc)/' | wc -l)
  [ "$idle" -ge ${#NODES[@]} ] && break
  if [ "$(date +%s)" -ge "$deadline" ]; then
    echo "$states" >&2
    tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd-*.log /var/log/slurm/slurmd-*.out >&2 || true
    die "the nodes did not come up idle in ${WAIT_S}s"
  fi
  # A node that was down from an earlier run comes back once its slurmd registers.
  for node in $(echo "$states" | awk '$2 ~ /^(down|drain|drng|fail)/ {print $1}'); do
    scontrol update nodename="$node" state=resume 2>/dev/null || true
  done
  sleep 0.5
done
echo "slurm_up: nodes ${NODES[*]} idle"
