#!/usr/bin/env bash
# A throw-away single-node SLURM cluster for the test suite.
#
#   tests/slurm/cluster.sh start DIR   start munged, slurmctld and slurmd; every file lives under DIR
#   tests/slurm/cluster.sh stop DIR    cancel jobs, stop the daemons, kill leftover job steps (idempotent)
#   tests/slurm/cluster.sh status DIR  print the node and queue state
#   tests/slurm/cluster.sh stop-all    stop every test cluster started by this script on this machine
#                                      (e.g. left behind by a killed pytest run)
#
# `start` prints, on stdout and nothing else, the lines a client needs:
#   export SLURM_CONF=DIR/slurm.conf
#   export HARNESS_SLURM_PARTITION=debug
#   export HARNESS_SLURM_MAX_ARRAY_SIZE=8
#   export HARNESS_SLURM_REQUEUE_DELAY_S=121
# (the same lines are written to DIR/env.sh).  Progress and errors go to stderr.
# sbatch, squeue, scontrol, scancel and sinfo need only SLURM_CONF: slurm.conf names the
# controller's loopback port and the private munge socket (AuthInfo=socket=...).
#
# Needs root and Debian's packages:  apt-get install -y slurmctld slurmd slurm-client munge
# (SLURM 22.05 on Debian 12).  No cgroups, no accounting, no systemd, loopback only.
#
# Environment knobs (all optional):
#   SLURM_TEST_MAX_ARRAY_SIZE   MaxArraySize (default 8: array indices 0..7)
#   SLURM_TEST_MIN_JOB_AGE      MinJobAge in seconds (default 10)
#   SLURM_TEST_PARTITION        partition name (default debug)
#   SLURM_TEST_GPUS             number of fake GPUs on the node (default 2)
#   SLURM_TEST_CTLD_PORT        slurmctld port (default: a free loopback port)
#   SLURM_TEST_SLURMD_PORT      slurmd port (default: a free loopback port)
#   SLURM_TEST_START_TIMEOUT    seconds to wait for each daemon to answer, then the node to be idle (default 60)
#   SLURM_TEST_CRED_EXPIRE      AuthInfo cred_expire (SLURM's default 120, minimum 5); a requeued
#                               job waits cred_expire + 1 seconds (BeginTime) before it runs again
#
# Design notes:
# * munged runs with its own key, socket, pid, log and seed files under DIR/munge, so it never
#   talks to (or disturbs) a system munged on /run/munge.
# * Every daemon is started with HARNESS_SLURM_TEST_DIR=DIR in its environment.  slurmstepd
#   inherits it from slurmd, so `stop` can find job steps of this cluster (and their children)
#   without killing anything by name.  `start` also stops "stale" test clusters: processes that
#   carry the marker for a directory that no longer exists (a crashed earlier run).
# * The node line copies what `slurmd -C` detects (CPUs, sockets, cores, threads, RealMemory)
#   so the node is never drained for "Low RealMemory" or "Low socket*core*thread count".
# * Fake GPUs: gres.conf names two character devices DIR/dev/nvidia[0-1] (mknod c 1 3, i.e.
#   /dev/null's numbers).  A count-only gres line leaves the node INVAL.
# * slurmctld is started with -c (clear saved state), so every start is a fresh cluster and job
#   ids start again at 1.
set -euo pipefail

die() { echo "cluster.sh: error: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }

usage() {
    echo "usage: $0 {start|stop|status} DIR | $0 stop-all" >&2
    exit 2
}

ACTION=${1:-}
if [[ $ACTION == stop-all ]]; then
    [[ $# -eq 1 ]] || usage
    set -- stop-all /nonexistent
fi
[[ $# -eq 2 && -n $2 ]] || usage
[[ $ACTION == start ]] && { mkdir -p -- "$2" || exit 1; }
if [[ -d $2 ]]; then
    DIR=$(cd -- "$2" && pwd -P)
else
    case $2 in /*) DIR=$2 ;; *) DIR=$PWD/$2 ;; esac
fi

CONF=$DIR/slurm.conf
MUNGE_DIR=$DIR/munge
MUNGE_SOCKET=$MUNGE_DIR/munge.socket
MUNGE_PID=$MUNGE_DIR/munged.pid
CTLD_PID=$DIR/run/slurmctld.pid
SLURMD_PID=$DIR/run/slurmd.pid
LOG_DIR=$DIR/log
MARKER=HARNESS_SLURM_TEST_DIR

# ---------------------------------------------------------------- process helpers

pid_alive() { [[ -n ${1:-} ]] && kill -0 "$1" 2>/dev/null; }

read_pid() { # read_pid FILE -> pid on stdout (empty if none or not alive)
    local p
    [[ -f $1 ]] || return 0
    p=$(tr -dc '0-9' <"$1" 2>/dev/null || true)
    if pid_alive "$p"; then echo "$p"; fi
}

pid_file_dead() { # pid_file_dead FILE -> true if FILE names a pid that is no longer alive
    local p
    [[ -f $1 ]] || return 1
    p=$(tr -dc '0-9' <"$1" 2>/dev/null || true)
    [[ -n $p ]] && ! pid_alive "$p"
}

marked_pids() { # marked_pids DIR -> this cluster's daemons and job steps
    # daemons carry HARNESS_SLURM_TEST_DIR=DIR; slurmd starts slurmstepd with an environment of
    # its own making, but that one has SLURM_CONF=DIR/slurm.conf (clients have it too, so it only
    # counts for processes named slurmstepd)
    local want="$MARKER=$1" conf="SLURM_CONF=$1/slurm.conf" env_file pid comm envs
    for env_file in /proc/[0-9]*/environ; do
        pid=${env_file#/proc/}
        pid=${pid%/environ}
        [[ $pid == "$$" || $pid == "$BASHPID" ]] && continue
        envs=$(tr '\0' '\n' 2>/dev/null <"$env_file") || continue
        if grep -qxF -- "$want" <<<"$envs"; then
            echo "$pid"
        elif grep -qxF -- "$conf" <<<"$envs"; then
            comm=$(cat 2>/dev/null <"/proc/$pid/comm") || continue
            [[ $comm == slurmstepd ]] && echo "$pid"
        fi
    done
}

descendants() { # descendants PID... -> those pids and all their descendants
    local -A children=()
    local stat pid ppid rest
    for stat in /proc/[0-9]*/stat; do
        # field 4 is the ppid; field 2 (comm) may contain spaces, so cut after the last ')'
        rest=$(cat 2>/dev/null <"$stat") || continue
        pid=${rest%% *}
        rest=${rest##*) }
        ppid=$(echo "$rest" | cut -d' ' -f2)
        children[$ppid]+=" $pid"
    done
    local -a queue=("$@")
    local -A seen=()
    while ((${#queue[@]})); do
        pid=${queue[0]}
        queue=("${queue[@]:1}")
        [[ -n ${seen[$pid]:-} ]] && continue
        seen[$pid]=1
        echo "$pid"
        # shellcheck disable=SC2206
        queue+=(${children[$pid]:-})
    done
}

wait_gone() { # wait_gone SECONDS PID... ; returns 1 if some are still alive
    local deadline=$((SECONDS + $1)) p alive
    shift
    while :; do
        alive=0
        for p in "$@"; do pid_alive "$p" && alive=1; done
        ((alive)) || return 0
        ((SECONDS >= deadline)) && return 1
        sleep 0.1
    done
}

terminate() { # terminate PID... : SIGTERM, wait up to 10 s, then SIGKILL
    local -a pids=() p
    for p in "$@"; do pid_alive "$p" && pids+=("$p"); done
    ((${#pids[@]})) || return 0
    kill -TERM "${pids[@]}" 2>/dev/null || true
    if ! wait_gone 10 "${pids[@]}"; then
        log "pids ${pids[*]} ignored SIGTERM for 10 s; killing them"
        kill -KILL "${pids[@]}" 2>/dev/null || true
        wait_gone 5 "${pids[@]}" || log "pids ${pids[*]} survived SIGKILL"
    fi
}

# ---------------------------------------------------------------- stop

stop_cluster() { # stop_cluster DIR (DIR may already be gone)
    local dir=$1 conf=$1/slurm.conf p
    local ctld slurmd munged
    ctld=$(read_pid "$dir/run/slurmctld.pid")
    slurmd=$(read_pid "$dir/run/slurmd.pid")
    munged=$(read_pid "$dir/munge/munged.pid")

    # 1. cancel every job while the daemons are still up, so job steps end the normal way
    if [[ -n $ctld && -f $conf ]]; then
        if SLURM_CONF=$conf timeout 10 scancel --quiet --user="$(id -un)" 2>/dev/null; then
            local deadline=$((SECONDS + 10))
            while ((SECONDS < deadline)); do
                [[ -z $(SLURM_CONF=$conf timeout 5 squeue -h -o %i -t R,CG,S,CF 2>/dev/null || echo busy) ]] && break
                sleep 0.2
            done
        fi
    fi

    # 2. slurmd and slurmctld together (each takes about 2 s to shut down)
    terminate "$slurmd" "$ctld"

    # 3. anything else that carries this cluster's marker: slurmstepd's and their job processes
    local -a left=()
    mapfile -t left < <(marked_pids "$dir")
    if ((${#left[@]})); then
        local -a tree=()
        mapfile -t tree < <(descendants "${left[@]}")
        local -a victims=()
        for p in "${tree[@]}"; do
            [[ $p == "$munged" ]] && continue
            victims+=("$p")
        done
        if ((${#victims[@]})); then
            log "killing leftover processes of $dir: ${victims[*]}"
            kill -KILL "${victims[@]}" 2>/dev/null || true
            wait_gone 5 "${victims[@]}" || true
        fi
    fi

    # 4. munged last (the others need it to talk while shutting down)
    terminate "$munged"
    rm -f "$dir/run/slurmctld.pid" "$dir/run/slurmd.pid" "$dir/munge/munged.pid" 2>/dev/null || true
    return 0
}

cluster_dirs() { # the DIR of every running test cluster (from the daemons' marker)
    local env_file
    for env_file in /proc/[0-9]*/environ; do
        tr '\0' '\n' 2>/dev/null <"$env_file" | sed -n "s/^$MARKER=//p" | head -n1 || true
    done | sort -u
}

stop_all_clusters() {
    local d
    while read -r d; do
        [[ -n $d ]] || continue
        if [[ -d $d ]]; then
            log "stopping the test cluster in $d"
            stop_cluster "$d"
        fi
    done < <(cluster_dirs)
    stop_stale_clusters
}

stop_stale_clusters() { # clusters whose directory was deleted while their daemons ran
    local d
    while read -r d; do
        [[ -n $d && ! -d $d ]] || continue
        log "stopping a stale test cluster whose directory is gone: $d"
        local -a pids=()
        mapfile -t pids < <(marked_pids "$d")
        ((${#pids[@]})) || continue
        mapfile -t pids < <(descendants "${pids[@]}")
        kill -KILL "${pids[@]}" 2>/dev/null || true
        wait_gone 5 "${pids[@]}" || true
    done < <(cluster_dirs)
}

# ---------------------------------------------------------------- start

port_in_use() {
    local port=$1
    if command -v ss >/dev/null 2>&1; then
        ss -Htan 2>/dev/null | awk '{print $4}' | grep -qE "[:.]$port\$"
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null
    fi
}

free_port() { # free_port EXCLUDE -> a port in 20000..59999 not listened on by anyone
    local exclude=${1:-0} port i
    for i in $(seq 1 200); do
        port=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
        [[ $port == "$exclude" ]] && continue
        port_in_use "$port" || { echo "$port"; return 0; }
    done
    die "no free TCP port found"
}

show_logs() {
    local f
    for f in "$LOG_DIR"/slurmctld.log "$LOG_DIR"/slurmd.log "$LOG_DIR"/munged.log \
        "$LOG_DIR"/slurmctld.stderr "$LOG_DIR"/slurmd.stderr "$LOG_DIR"/munged.stderr; do
        [[ -s $f ]] || continue
        echo "----- tail -n 25 $f" >&2
        tail -n 25 "$f" >&2
    done
}

fail_start() {
    echo "cluster.sh: error: $*" >&2
    show_logs
    stop_cluster "$DIR" || true
    exit 1
}

start_cluster() {
    local cmd
    for cmd in munged munge slurmctld slurmd sbatch sinfo scontrol scancel squeue; do
        command -v "$cmd" >/dev/null 2>&1 ||
            die "'$cmd' not found; install: apt-get install -y slurmctld slurmd slurm-client munge"
    done
    [[ $(id -u) == 0 ]] || die "must run as root (slurmd runs jobs as their submitting user)"
    [[ -d $DIR ]] || die "cannot create $DIR"
    # sun_path is 108 bytes; keep the munge socket path well below that
    ((${#MUNGE_SOCKET} < 100)) || die "DIR is too long for a unix socket path: $MUNGE_SOCKET"

    # a previous cluster in the same DIR, or stale ones from deleted directories
    stop_cluster "$DIR"
    stop_stale_clusters

    local partition=${SLURM_TEST_PARTITION:-debug}
    local max_array=${SLURM_TEST_MAX_ARRAY_SIZE:-8}
    local min_job_age=${SLURM_TEST_MIN_JOB_AGE:-10}
    local ngpus=${SLURM_TEST_GPUS:-2}
    local timeout=${SLURM_TEST_START_TIMEOUT:-60}
    local cred_expire=${SLURM_TEST_CRED_EXPIRE:-}
    local authinfo="socket=$MUNGE_SOCKET"
    if [[ -n $cred_expire ]]; then
        ((cred_expire >= 5)) || die "SLURM_TEST_CRED_EXPIRE must be >= 5"
        authinfo+=",cred_expire=$cred_expire"
    fi
    local host node_hw ctld_port slurmd_port
    host=$(hostname -s)
    [[ -n $host ]] || die "hostname -s is empty"

    # what slurmd detects; the node line must not claim more than this
    node_hw=$(env -u SLURM_CONF slurmd -C 2>/dev/null | head -n1 | sed -E 's/^NodeName=[^ ]+ //') ||
        true
    [[ $node_hw == *CPUs=*RealMemory=* ]] || die "could not parse 'slurmd -C': $node_hw"

    ctld_port=${SLURM_TEST_CTLD_PORT:-$(free_port 0)}
    slurmd_port=${SLURM_TEST_SLURMD_PORT:-$(free_port "$ctld_port")}

    rm -rf "${DIR:?}/state" "${DIR:?}/spool" "${DIR:?}/run" "${DIR:?}/dev" "$LOG_DIR" "$MUNGE_DIR"
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/run" "$DIR/dev" "$LOG_DIR" "$MUNGE_DIR"
    chmod 0755 "$DIR"
    chmod 0700 "$DIR/state"
    chmod 0755 "$MUNGE_DIR" # munged wants the socket's directory searchable by all

    # fake GPUs: character devices with /dev/null's numbers
    local i gpu_files
    for ((i = 0; i < ngpus; i++)); do
        mknod -m 0666 "$DIR/dev/nvidia$i" c 1 3 || die "mknod $DIR/dev/nvidia$i failed"
    done
    gpu_files="$DIR/dev/nvidia[0-$((ngpus - 1))]"
    ((ngpus == 1)) && gpu_files="$DIR/dev/nvidia0"

    # private munge key
    head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key"
    chmod 0400 "$MUNGE_DIR/munge.key"

    cat >"$CONF" <<EOF
# generated by tests/slurm/cluster.sh; a throw-away single-node test cluster
ClusterName=harnesstest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=$authinfo
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$SLURMD_PID
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups on these machines
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# no accounting: sacct fails, submitit bypasses it
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SwitchType=switch/none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=256
GresTypes=gpu
MaxArraySize=$max_array
MinJobAge=$min_job_age
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=2
Waittime=0
NodeName=$host NodeAddr=127.0.0.1 NodeHostname=$host $node_hw Gres=gpu:$ngpus State=UNKNOWN
PartitionName=$partition Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
    cat >"$DIR/gres.conf" <<EOF
NodeName=$host Name=gpu File=$gpu_files
EOF

    # the marker lets `stop` find job steps; SLURM_CONF makes every child use this cluster
    local -a daemon_env=(env "$MARKER=$DIR" "SLURM_CONF=$CONF")

    log "starting munged ($MUNGE_SOCKET)"
    "${daemon_env[@]}" munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
        --pid-file="$MUNGE_PID" --log-file="$LOG_DIR/munged.log" \
        --seed-file="$MUNGE_DIR/munged.seed" --num-threads=4 --force \
        </dev/null >"$LOG_DIR/munged.stderr" 2>&1 || fail_start "munged did not start"
    local deadline=$((SECONDS + timeout))
    until munge -n -S "$MUNGE_SOCKET" 2>/dev/null | unmunge -S "$MUNGE_SOCKET" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || fail_start "munged does not answer on $MUNGE_SOCKET"
        sleep 0.1
    done

    log "starting slurmctld (port $ctld_port)"
    "${daemon_env[@]}" slurmctld -c -f "$CONF" </dev/null >"$LOG_DIR/slurmctld.stderr" 2>&1 ||
        fail_start "slurmctld did not start"
    deadline=$((SECONDS + timeout))
    until SLURM_CONF=$CONF scontrol ping 2>/dev/null | grep -q 'is UP'; do
        ((SECONDS < deadline)) || fail_start "slurmctld does not answer on port $ctld_port"
        sleep 0.2
    done

    log "starting slurmd (port $slurmd_port)"
    "${daemon_env[@]}" slurmd -c -f "$CONF" </dev/null >"$LOG_DIR/slurmd.stderr" 2>&1 ||
        fail_start "slurmd did not start"

    local state="" reason=""
    deadline=$((SECONDS + timeout))
    while :; do
        state=$(SLURM_CONF=$CONF sinfo -h -N -n "$host" -o %T 2>/dev/null | head -n1 || true)
        [[ $state == idle ]] && break
        if ((SECONDS >= deadline)); then
            reason=$(SLURM_CONF=$CONF scontrol show node "$host" 2>&1 | grep -E 'State=|Reason=' || true)
            fail_start "node $host is not idle after ${timeout}s (sinfo state: '${state:-none}')
$reason"
        fi
        # slurmd -c returns as it forks; the daemon writes its pid file a moment later, so only a
        # pid file naming a process that is gone means slurmd exited (was: a missing file did, a
        # race that a loaded machine lost)
        pid_file_dead "$SLURMD_PID" && fail_start "slurmd exited"
        sleep 0.2
    done

    cat >"$DIR/env.sh" <<EOF
export SLURM_CONF=$CONF
export HARNESS_SLURM_PARTITION=$partition
export HARNESS_SLURM_MAX_ARRAY_SIZE=$max_array
export HARNESS_SLURM_REQUEUE_DELAY_S=$((${cred_expire:-120} + 1))
EOF
    log "node $host is idle (partition $partition, ${ngpus} fake GPUs, MaxArraySize=$max_array)"
    cat "$DIR/env.sh"
}

status_cluster() {
    [[ -f $CONF ]] || die "no cluster in $DIR"
    echo "munged: $(read_pid "$MUNGE_PID") slurmctld: $(read_pid "$CTLD_PID") slurmd: $(read_pid "$SLURMD_PID")"
    SLURM_CONF=$CONF sinfo -N -o '%N %T %c %m %G' || true
    SLURM_CONF=$CONF squeue || true
}

case $ACTION in
start) start_cluster ;;
stop) stop_cluster "$DIR" ;;
stop-all) stop_all_clusters ;;
status) status_cluster ;;
*) usage ;;
esac
