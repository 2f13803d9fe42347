#!/usr/bin/env bash
# Makes a Slurm the tests can submit to (tests/test_slurm_sweep.py), best effort, and says how to
# reach it: on success the last line of standard output is `export SLURM_CONF=...` (or nothing to
# export where the default configuration works), so a caller does
#
#     eval "$(scripts/local-slurm.sh)"
#
# In order: a Slurm that already answers (SLURM_CONF, or the system's default configuration) is used
# as it is; else, as root with Debian's slurm-wlm and munge installed, a single-host Slurm is started:
# munged as user munge, then slurmctld and slurmd with a slurm.conf generated under
# ${CORE_SLURM_DIR:-/tmp/core-slurm} (this host one node, one partition "debug", no accounting, its
# own ports). Running it again finds that Slurm answering and starts nothing. Where it cannot, it
# says why on standard error and exits 1; nothing it prints goes to standard output then.
#
# `local-slurm.sh --nodes N` (N from 2 to 16) starts, or finds, another Slurm beside that one: N
# nodes on this one host (one slurmd each, named core-node1..N, each on a port of its own, the
# host's CPUs shared out), under ${CORE_SLURM_DIR:-/tmp/core-slurm-Nnodes}, for the tests of
# multi-node jobs (tests/test_multinode_jobs.py). A job's first node is its rendezvous, by name, as on
# a real cluster: where the names do not resolve, it adds `127.0.0.1 core-node1 ...` to /etc/hosts.
set -uo pipefail

NODES=1
while [ $# -gt 0 ]; do
    case "$1" in
        --nodes) NODES="${2:-}"; shift $(($# > 1 ? 2 : 1)) ;;
        --nodes=*) NODES="${1#*=}"; shift ;;
        *) echo "local-slurm: unknown argument '$1' (usage: local-slurm.sh [--nodes N])" >&2; exit 2 ;;
    esac
done
if ! [[ "$NODES" =~ ^[0-9]+$ ]] || [ "$NODES" -lt 1 ] || [ "$NODES" -gt 16 ]; then
    echo "local-slurm: --nodes takes a whole number from 1 to 16, not '$NODES'" >&2
    exit 2
fi
if [ "$NODES" -eq 1 ]; then
    DIR="${CORE_SLURM_DIR:-/tmp/core-slurm}"
    CTLD_PORT="${CORE_SLURM_CTLD_PORT:-16917}"
    SLURMD_PORT="${CORE_SLURM_SLURMD_PORT:-16918}"
else
    # Its own folder and ports: the single-host Slurm keeps running beside it.
    DIR="${CORE_SLURM_DIR:-/tmp/core-slurm-${NODES}nodes}"
    CTLD_PORT="${CORE_SLURM_CTLD_PORT:-16940}"
    SLURMD_PORT="${CORE_SLURM_SLURMD_PORT:-16941}" # the first node's; node i listens on this + i - 1
fi

say() { echo "local-slurm: $*" >&2; }
cannot() {
    say "no Slurm: $*; the Slurm tests will skip"
    exit 1
}
answers() { timeout 20 sinfo --noheader --format=%P >/dev/null 2>&1; }
# Nodes up (idle, mixed or allocated) in the Slurm SLURM_CONF names.
nodes_up() { timeout 20 sinfo --Node --noheader --states=idle,mixed,allocated --format=%N 2>/dev/null | sort -u | grep -c .; }

command -v sinfo >/dev/null 2>&1 || cannot "Slurm's commands are not installed (Debian: apt-get install slurm-wlm)"

if [ "$NODES" -gt 1 ]; then
    # Only its own Slurm will do: another one answering has other nodes.
    if [ -f "$DIR/slurm.conf" ] && [ "$(SLURM_CONF="$DIR/slurm.conf" nodes_up)" -eq "$NODES" ]; then
        say "the $NODES-node Slurm under $DIR answers"
        echo "export SLURM_CONF=$(printf %q "$DIR/slurm.conf")"
        exit 0
    fi
elif [ -n "${SLURM_CONF:-}" ] && answers; then
    say "Slurm answers with SLURM_CONF=$SLURM_CONF"
    echo "export SLURM_CONF=$(printf %q "$SLURM_CONF")"
    exit 0
elif [ -f "$DIR/slurm.conf" ] && SLURM_CONF="$DIR/slurm.conf" answers; then
    say "the single-host Slurm under $DIR answers"
    echo "export SLURM_CONF=$(printf %q "$DIR/slurm.conf")"
    exit 0
elif [ -z "${SLURM_CONF:-}" ] && answers; then
    say "Slurm answers with the system's configuration"
    exit 0
fi

[ "$(id -u)" -eq 0 ] || cannot "none answers, and starting one needs root (this is uid $(id -u))"
for program in munged slurmctld slurmd; do
    command -v "$program" >/dev/null 2>&1 || [ -x "/usr/sbin/$program" ] ||
        cannot "$program is not installed (Debian: apt-get install slurm-wlm munge)"
done
export PATH="$PATH:/usr/sbin"

# munge: Slurm's authentication. Its key comes with Debian's package; its socket directory does not
# survive a reboot (or a container's start).
if ! { munge -n | unmunge; } >/dev/null 2>&1; then
    [ -f /etc/munge/munge.key ] || {
        if command -v mungekey >/dev/null 2>&1; then mungekey --create >/dev/null 2>&1; fi
    } || cannot "munge has no key (/etc/munge/munge.key)"
    mkdir -p /run/munge && chown munge:munge /run/munge
    if command -v runuser >/dev/null 2>&1; then
        runuser -u munge -- munged || cannot "munged did not start"
    else
        su -s /bin/sh munge -c munged || cannot "munged did not start"
    fi
    sleep 1
    { munge -n | unmunge; } >/dev/null 2>&1 || cannot "munged started but does not answer"
fi

mkdir -p "$DIR/state" "$DIR/spool"
host="$(hostname -s)"
cpus="$(nproc)"
memory_mb="$(awk '/MemTotal/ { printf "%d", $2 / 1024 * 0.8 }' /proc/meminfo)"
if [ "$NODES" -eq 1 ]; then
    cluster=corelocal
    description="a single-host Slurm"
    slurmd_files="SlurmdSpoolDir=$DIR/spool
SlurmdPidFile=$DIR/slurmd.pid
SlurmdLogFile=$DIR/slurmd.log
SlurmdPort=$SLURMD_PORT"
    node_lines="NodeName=$host CPUs=$cpus RealMemory=$memory_mb State=UNKNOWN"
    node_names=("$host")
else
    cluster="corelocal$NODES"
    description="a $NODES-node Slurm on this host"
    # %n: each slurmd (-N NAME) keeps its own spool, pid file and log.
    slurmd_files="SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/slurmd-%n.pid
SlurmdLogFile=$DIR/slurmd-%n.log"
    node_cpus=$((cpus / NODES > 0 ? cpus / NODES : 1))
    node_memory=$((memory_mb / NODES))
    node_lines=""
    node_names=()
    for i in $(seq "$NODES"); do
        node_names+=("core-node$i")
        mkdir -p "$DIR/spool/core-node$i"
        node_lines+="NodeName=core-node$i NodeHostname=$host NodeAddr=127.0.0.1 Port=$((SLURMD_PORT + i - 1))"
        node_lines+=" CPUs=$node_cpus RealMemory=$node_memory State=UNKNOWN"$'\n'
    done
    # A job's rendezvous is its first node's name, which every node must resolve.
    if [ "$(getent hosts "${node_names[@]}" 2>/dev/null | wc -l)" -ne "$NODES" ]; then
        echo "127.0.0.1 ${node_names[*]}  # core's scripts/local-slurm.sh --nodes $NODES" >>/etc/hosts ||
            cannot "could not add the nodes' names to /etc/hosts"
    fi
fi
cat >"$DIR/slurm.conf" <<EOF
# Generated by core's scripts/local-slurm.sh: $description for the tests.
ClusterName=$cluster
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmctldLogFile=$DIR/slurmctld.log
SlurmctldPort=$CTLD_PORT
$slurmd_files
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
$node_lines
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$DIR/slurm.conf"
slurmctld -f "$SLURM_CONF" || cannot "slurmctld did not start (see $DIR/slurmctld.log)"
if [ "$NODES" -eq 1 ]; then
    slurmd -f "$SLURM_CONF" || cannot "slurmd did not start (see $DIR/slurmd.log)"
else
    for name in "${node_names[@]}"; do
        slurmd -f "$SLURM_CONF" -N "$name" || cannot "slurmd $name did not start (see $DIR/slurmd-$name.log)"
    done
fi
for _ in $(seq 30); do
    if answers && [ "$(nodes_up)" -eq "$NODES" ]; then
        say "started $description: SLURM_CONF=$SLURM_CONF (logs in $DIR)"
        echo "export SLURM_CONF=$(printf %q "$SLURM_CONF")"
        exit 0
    fi
    sleep 1
done
cannot "slurmctld and slurmd started but not all $NODES node(s) are up after 30 s (see $DIR/*.log)"
