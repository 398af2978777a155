# shellcheck shell=bash
# Shared by tests/testbed/up and tests/testbed/down (sourced, not executed).
# Everything the testbed owns lives under $CACHE; see README.md.

CACHE=${KINETIC_TESTBED_CACHE:-$HOME/.cache/kinetic-testbed}
BIN=$CACHE/bin          # kube-* binaries + pause (built once)
IMAGES=$CACHE/images    # rootfs tarball of the base image (built once)
PKI=$CACHE/pki          # service-account key pair, API token (made once)
STATE=$CACHE/state      # docker data-root, registry storage, etcd, kubelet root...
RUN=$CACHE/run          # pid files, kubeconfig, env.sh / env.json, sockets
LOGS=$CACHE/logs        # one log per component (previous run kept as NAME.log.1)

K8S_VERSION=v1.20.2
API_PORT=6443
API_SERVER=https://127.0.0.1:$API_PORT
REGISTRY_PORT=${KINETIC_TESTBED_REGISTRY_PORT:-5000}
GCS_PORT=${KINETIC_TESTBED_GCS_PORT:-4443}
BASE_IMAGE_LOCAL=local/debian-py:bookworm
PY313_IMAGE_LOCAL=local/debian-py:trixie
PAUSE_IMAGE=local/pause:3.4.1
DOCKER_SOCK=$RUN/docker.sock
KUBECONFIG_LOCAL=$RUN/kubeconfig

# Components in start order; `down` stops them in reverse.
COMPONENTS=(dockerd registry fake-gcs etcd kube-apiserver kube-controller-manager kube-scheduler kubelet)

# Never fail silently: name the command and line that failed under `set -e`.
set -E
trap 'log "ERROR: \"$BASH_COMMAND\" failed (exit $?) at ${BASH_SOURCE[0]##*/}:$LINENO"' ERR

log() { printf '[testbed %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

docker_cli() {
    local d
    if [[ -x /usr/bin/docker ]]; then d=/usr/bin/docker; else d=$(command -v docker) || die "no docker CLI"; fi
    DOCKER_HOST=${TESTBED_DOCKER_HOST:-unix://$DOCKER_SOCK} "$d" "$@"
}

pid_of() { [[ -s $RUN/$1.pid ]] && cat "$RUN/$1.pid"; }

# 0 if NAME's recorded pid is alive and still runs the binary we recorded for it
# (guards against pid reuse; a zombie has an empty cmdline and counts as dead).
alive() {
    local name=$1 pid exe arg0
    pid=$(pid_of "$name") || return 1
    [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
    exe=$(cat "$RUN/$name.exe" 2>/dev/null) || return 1
    arg0=$(tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | head -n 1) || return 1
    [[ $arg0 == "$exe" ]]
}

# 0 while NAME's recorded pid is a live process, whatever it runs yet: just after
# `start`, it may still be the shell's fork or `setsid`, before it execs the binary
# (`alive` would call it dead; `wait_for` must not). A zombie is not running.
running() {
    local pid state
    pid=$(pid_of "$1") || return 1
    state=$(sed 's/.*) //' "/proc/$pid/stat" 2>/dev/null | cut -d' ' -f1) || return 1
    [[ -n $state && $state != Z && $state != X ]]
}

# start NAME EXE ARGS... : plain background command, own session, own pid file.
start() {
    local name=$1
    shift
    [[ -f $LOGS/$name.log ]] && mv -f "$LOGS/$name.log" "$LOGS/$name.log.1"
    # 9>&- : do not let the daemon inherit the lock on $CACHE/.lock
    setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null 9>&- &
    echo $! >"$RUN/$name.pid"
    printf '%s\n' "$1" >"$RUN/$name.exe"
    log "started $name (pid $!, log $LOGS/$name.log)"
}

# stop NAME: SIGTERM, wait up to 10 s, SIGKILL; only the pid we recorded.
stop() {
    local name=$1 pid i
    if alive "$name"; then
        pid=$(pid_of "$name")
        log "stopping $name (pid $pid)"
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 100; i++)); do alive "$name" || break; sleep 0.1; done
        if alive "$name"; then
            log "$name still running after 10 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do alive "$name" || break; sleep 0.1; done
        fi
    fi
    rm -f "$RUN/$name.pid" "$RUN/$name.exe"
}

fail_component() {
    log "ERROR: $1: $2"
    local f=$LOGS/$1.log
    if [[ -f $f ]]; then
        # A Go crash dumps thousands of goroutine lines: show its cause first.
        if grep -qE '^(panic: |fatal error: |unexpected fault address|F[0-9]{4} )' "$f"; then
            log "fatal lines of $f:"
            grep -m 3 -A 4 -E '^(panic: |fatal error: |unexpected fault address|F[0-9]{4} )' "$f" | cut -c1-400 >&2 || true
        fi
        log "last lines of $f:"
        grep -vE '^(goroutine |\s|created by |$)' "$f" | tail -n 30 | cut -c1-400 >&2 || true
    fi
    exit 1
}

# wait_for NAME TIMEOUT WHAT CMD... : poll CMD until it succeeds; fail fast if NAME dies.
wait_for() {
    local name=$1 timeout=$2 what=$3
    shift 3
    local deadline=$((SECONDS + timeout))
    until "$@" >/dev/null 2>&1; do
        if [[ -n $name ]] && ! running "$name"; then
            fail_component "$name" "exited while waiting for $what"
        fi
        ((SECONDS < deadline)) || fail_component "$name" "timed out after ${timeout}s waiting for $what"
        sleep 0.2
    done
}

# Mount points under DIR, deepest first (mountinfo field 5, octal escapes decoded).
mounts_under() {
    local dir
    dir=$(realpath -m "$1")
    awk '{print $5}' /proc/self/mountinfo | while IFS= read -r m; do
        m=$(printf '%b' "$m")
        if [[ $m == "$dir" || $m == "$dir"/* ]]; then printf '%s\n' "$m"; fi
    done | awk '{print length($0) "\t" $0}' | sort -rn | cut -f2-
}

unmount_under() {
    local dir=$1 m i
    for ((i = 0; i < 5; i++)); do
        local left
        left=$(mounts_under "$dir")
        [[ -z $left ]] && return 0
        while IFS= read -r m; do
            umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || true
        done <<<"$left"
    done
    left=$(mounts_under "$dir")
    [[ -z $left ]] || { log "WARNING: still mounted under $dir:"; printf '  %s\n' "$left" >&2; return 1; }
}

# Remove a directory tree that may hold read-only files (Go module cache) or mounts.
remove_tree() {
    local dir=$1
    [[ -e $dir ]] || return 0
    unmount_under "$dir" || die "cannot unmount everything under $dir"
    chmod -R u+w "$dir" 2>/dev/null || true
    rm -rf "$dir"
}
