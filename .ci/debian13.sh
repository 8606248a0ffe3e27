#!/usr/bin/env bash
# Run a command on this repository inside a Debian 13 "trixie" chroot
# (libtorch 2.6, xsimd 13, g++ 14), as CI's second configuration.
#
#   bash .ci/debian13.sh                 # configure, build and test in build-debian13/ (.ci/suite.sh)
#   bash .ci/debian13.sh CMD [ARGS...]   # run CMD in the repository root inside the chroot
#
# Must run as root. The chroot is kept under /var/cache/torchprobe/trixie between
# runs (a kept, ready chroot costs ~1-3 s; a fresh one 1-3 min, ~300 MB download). The
# Debian mirror is read at run time from the host's apt configuration.
#
# Environment knobs (all optional):
#   TORCHPROBE_DEBIAN13_BUILD_DIR  build directory for the default command (build-debian13)
#   TORCHPROBE_DEBIAN13_JOBS       parallel build jobs for the default command (2)
#   TORCHPROBE_DEBIAN13_CACHE      where the chroot is kept (/var/cache/torchprobe)
#   TORCHPROBE_DEBIAN13_REBUILD=1  delete the kept chroot and build a new one
#   TORCHPROBE_DEBIAN_MIRROR       mirror URL, overriding the host's apt configuration
#   TORCHPROBE_DEBIAN13_SANITIZE=1 the default command builds and runs the suite with ASan + UBSan
#                                  (-DTORCHPROBE_SANITIZE=ON, -O1): CI's sanitizer run (.ci/run)
# shellcheck disable=SC2317  # functions below are called from traps
set -euo pipefail

SUITE=trixie
CACHE_DIR=${TORCHPROBE_DEBIAN13_CACHE:-/var/cache/torchprobe}
ROOT=$CACHE_DIR/$SUITE
BUILD_DIR=${TORCHPROBE_DEBIAN13_BUILD_DIR:-build-debian13}
JOBS=${TORCHPROBE_DEBIAN13_JOBS:-2}
SRC_IN_CHROOT=/src
CLEAN_PATH=/usr/sbin:/usr/bin:/sbin:/bin
# libunwind8: capture_call_stack loads it at run time (as on Debian 12, where libtorch pulls it
# in), so the stack-trace test compares libunwind with glibc here too.
PACKAGES=(g++ cmake make libtorch-dev python3-torch libxsimd-dev nlohmann-json3-dev
          doctest-dev zlib1g-dev libbenchmark-dev binutils libunwind8 libsimdjson-dev chromium)
# Changing anything in the stamp (the recipe number or the package list) makes the
# next run reinstall the packages in the kept chroot.
STAMP_FILE=/etc/torchprobe-ci.stamp
STAMP_CONTENT="recipe=2 suite=$SUITE packages=${PACKAGES[*]}"

SETUP_LOG=$CACHE_DIR/setup.log   # output of debootstrap and apt-get
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
T_START=$(date +%s.%N)
TMP_ROOT=
CHILD_PID=

# Progress goes to fd 8 (the original stderr), even from inside functions whose
# output is redirected to the setup log.
exec 8>&2
log() { printf '[debian13] %s\n' "$*" >&8; }
die() { log "error: $*"; exit 1; }
setup_failed() {
    log "last lines of $SETUP_LOG:"
    tail -n 30 "$SETUP_LOG" >&8 || true
    die "$@"
}
since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }'; }

# ---------------------------------------------------------------- mounts / processes

# Mount points at or below $1 (deepest first), as seen by findmnt.
mounts_under() {
    findmnt -rn -o TARGET | awk -v p="$1" '$0 == p || index($0, p "/") == 1' | sort -r
}

unmount_under() {
    local dir=$1 target
    for _ in 1 2 3 4 5; do
        [ -n "$(mounts_under "$dir")" ] || return 0
        while IFS= read -r target; do
            umount "$target" 2>/dev/null || umount -l "$target" 2>/dev/null || true
        done < <(mounts_under "$dir")
    done
    [ -z "$(mounts_under "$dir")" ]
}

# A process is alive (and not a zombie waiting to be reaped).
alive() {
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    s=${s##*) }
    [ "${s%% *}" != Z ]
}

# PIDs of processes whose root directory lies inside one of our chroots.
chroot_pids() {
    local p r
    for p in /proc/[0-9]*; do
        r=$(readlink "$p/root" 2>/dev/null) || continue
        case $r in "$CACHE_DIR"/*) printf '%s\n' "${p#/proc/}" ;; esac
    done
}

kill_chroot_procs() {
    local pids
    mapfile -t pids < <(chroot_pids)
    [ "${#pids[@]}" -gt 0 ] || return 0
    log "stopping processes left in the chroot: ${pids[*]}"
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for _ in $(seq 50); do
        [ -n "$(chroot_pids)" ] || return 0
        sleep 0.1
    done
    mapfile -t pids < <(chroot_pids)
    [ "${#pids[@]}" -eq 0 ] || kill -KILL "${pids[@]}" 2>/dev/null || true
    sleep 0.2
}

# Stop the running child (started by run_bg in its own session) and its process group.
stop_child() {
    local pid=$CHILD_PID
    [ -n "$pid" ] || return 0
    CHILD_PID=
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
        alive "$pid" || break
        sleep 0.1
    done
    kill -KILL -- "-$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
}

# Run a command in its own session, so that a signal to this script can stop all of
# it; fd 9 (the lock) is not inherited, so a leftover never blocks the next run.
run_bg() {
    setsid "$@" <&0 8>&- 9>&- &
    CHILD_PID=$!
    local rc=0
    wait "$CHILD_PID" || rc=$?
    CHILD_PID=
    return "$rc"
}

# Delete a directory below $CACHE_DIR, never while anything is mounted inside it
# (with /dev bound in, rm -rf would delete the host's device nodes).
safe_rm() {
    local dir=$1
    case $dir in "$CACHE_DIR"/?*) ;; *) die "refusing to delete '$dir'" ;; esac
    [ -e "$dir" ] || return 0
    unmount_under "$dir" || die "refusing to delete $dir: still mounted: $(mounts_under "$dir" | tr '\n' ' ')"
    rm -rf --one-file-system -- "$dir"
}

cleanup() {
    local rc=$?
    set +e
    trap '' INT TERM HUP
    stop_child
    kill_chroot_procs
    unmount_under "$CACHE_DIR" || log "warning: could not unmount: $(mounts_under "$CACHE_DIR" | tr '\n' ' ')"
    if [ -n "$TMP_ROOT" ] && [ -e "$TMP_ROOT" ]; then
        log "removing the unfinished chroot $TMP_ROOT"
        safe_rm "$TMP_ROOT"
    fi
    exit "$rc"
}

on_signal() {
    trap '' INT TERM HUP
    log "caught SIG$1, stopping"
    exit "$2"  # runs cleanup via the EXIT trap
}

trap cleanup EXIT
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP

# --------------------------------------------------------------------- chroot setup

# The host's Debian mirror: the first non-security deb URI of its apt sources.
find_mirror() {
    local m='' f
    if [ -n "${TORCHPROBE_DEBIAN_MIRROR:-}" ]; then
        printf '%s\n' "$TORCHPROBE_DEBIAN_MIRROR"
        return
    fi
    for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list.d/*.sources; do
        [ -r "$f" ] || continue
        # deb822: paragraphs separated by blank lines; skip comments, disabled
        # stanzas, deb-src-only stanzas and the security archive.
        m=$(grep -v '^[[:space:]]*#' "$f" | awk '
            BEGIN { RS = ""; FS = "\n" }
            {
                types = ""; uris = ""; suites = ""; enabled = "yes"
                for (i = 1; i <= NF; i++) {
                    line = $i; key = tolower(line); sub(/:.*/, "", key)
                    val = line; sub(/^[^:]*:[ \t]*/, "", val)
                    if (key == "types") types = val
                    else if (key == "uris") uris = val
                    else if (key == "suites") suites = val
                    else if (key == "enabled") enabled = tolower(val)
                }
                if (enabled == "no" || (" " types " ") !~ / deb /) next
                if (suites ~ /-security/) next
                n = split(uris, u, /[ \t]+/)
                for (j = 1; j <= n; j++)
                    if (u[j] ~ /^(https?|ftp|file):/ && u[j] !~ /security/) { print u[j]; exit }
            }')
        [ -z "$m" ] || break
    done
    if [ -z "$m" ] && [ -r /etc/apt/sources.list ]; then
        m=$(awk '
            $1 == "deb" {
                for (i = 2; i <= NF; i++) {
                    if ($i ~ /^\[/) { while ($i !~ /\]$/ && i < NF) i++; continue }
                    if ($i ~ /^(https?|ftp|file):/ && $i !~ /security/ && $(i + 1) !~ /-security/) { print $i; exit }
                    break
                }
            }' /etc/apt/sources.list)
    fi
    [ -n "$m" ] || die "no Debian mirror found in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list (set TORCHPROBE_DEBIAN_MIRROR)"
    printf '%s\n' "${m%/}"
}

ensure_debootstrap() {
    command -v debootstrap >/dev/null 2>&1 && return 0
    local t
    t=$(date +%s.%N)
    log "installing debootstrap on the host"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y -q --no-install-recommends debootstrap </dev/null >>"$SETUP_LOG" 2>&1; then
        apt-get update -q </dev/null >>"$SETUP_LOG" 2>&1 || setup_failed "apt-get update failed on the host"
        apt-get install -y -q --no-install-recommends debootstrap </dev/null >>"$SETUP_LOG" 2>&1 \
            || setup_failed "could not install debootstrap on the host"
    fi
    command -v debootstrap >/dev/null 2>&1 || die "debootstrap is not available"
    log "installed debootstrap in $(since "$t") s"
}

# /proc, /dev (+ /dev/pts, a private /dev/shm) and resolv.conf in the chroot at $1.
mount_basics() {
    local root=$1
    mkdir -p "$root/proc" "$root/dev"
    mount -t proc proc "$root/proc"
    mount --bind /dev "$root/dev"
    mount --make-rslave "$root/dev"   # nothing mounted below it may propagate to the host
    mount --bind /dev/pts "$root/dev/pts"
    mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
    if [ -e /etc/resolv.conf ]; then
        rm -f "$root/etc/resolv.conf"
        cp -L /etc/resolv.conf "$root/etc/resolv.conf"
    fi
}

# Run a command inside the chroot at $1 with a clean environment.
in_chroot() {
    local root=$1
    shift
    run_bg env -i PATH="$CLEAN_PATH" HOME=/root LANG=C.UTF-8 chroot "$root" "$@"
}

install_packages() {
    local root=$1 mirror t
    t=$(date +%s.%N)
    mirror=$(find_mirror)
    log "installing packages in the chroot from $mirror: ${PACKAGES[*]}"
    printf 'deb %s %s main\n' "$mirror" "$SUITE" > "$root/etc/apt/sources.list"
    printf '#!/bin/sh\nexit 101\n' > "$root/usr/sbin/policy-rc.d"
    chmod 755 "$root/usr/sbin/policy-rc.d"
    rm -f "$root$STAMP_FILE"
    in_chroot "$root" /usr/bin/env DEBIAN_FRONTEND=noninteractive /bin/sh -ec '
        apt-get update -q
        apt-get install -y -q --no-install-recommends "$@"
        apt-get clean' sh "${PACKAGES[@]}" </dev/null >>"$SETUP_LOG" 2>&1 \
        || setup_failed "package installation failed in the chroot"
    printf '%s\n' "$STAMP_CONTENT" > "$root$STAMP_FILE"
    log "installed packages in $(since "$t") s"
}

bootstrap() {
    local mirror t
    : > "$SETUP_LOG"
    ensure_debootstrap
    mirror=$(find_mirror)
    TMP_ROOT=$(mktemp -d "$CACHE_DIR/.$SUITE.tmp.XXXXXX")
    chmod 755 "$TMP_ROOT"
    t=$(date +%s.%N)
    log "creating a new $SUITE chroot in $TMP_ROOT from $mirror"
    run_bg env -i PATH="$CLEAN_PATH" LANG=C.UTF-8 \
        debootstrap --variant=minbase "$SUITE" "$TMP_ROOT" "$mirror" </dev/null >>"$SETUP_LOG" 2>&1 \
        || setup_failed "debootstrap failed"
    log "debootstrap done in $(since "$t") s"
    unmount_under "$TMP_ROOT" || die "could not unmount what debootstrap left in $TMP_ROOT"
    mount_basics "$TMP_ROOT"
    install_packages "$TMP_ROOT"
    kill_chroot_procs
    unmount_under "$TMP_ROOT" || die "could not unmount $TMP_ROOT"
    mv -T "$TMP_ROOT" "$ROOT"
    TMP_ROOT=
    log "chroot ready at $ROOT"
}

# ---------------------------------------------------------------------------- main

[ "$(id -u)" -eq 0 ] || die "must run as root (mount, chroot)"
# No stdin at all (closed fd 0): use /dev/null so that redirections of fd 0 work.
{ : <&0; } 2>/dev/null || exec </dev/null

mkdir -p "$CACHE_DIR"
exec 9>"$CACHE_DIR/.lock"
if ! flock -n 9; then
    log "waiting for another run to release $CACHE_DIR/.lock"
    flock 9
fi

# Leftovers of a killed run (we hold the lock, so nothing else is using the chroot).
if [ -n "$(chroot_pids)" ] || [ -n "$(mounts_under "$CACHE_DIR")" ]; then
    log "clearing leftovers of an interrupted run"
    kill_chroot_procs
    unmount_under "$CACHE_DIR" || die "could not unmount leftovers: $(mounts_under "$CACHE_DIR" | tr '\n' ' ')"
fi
for stale in "$CACHE_DIR"/."$SUITE".tmp.*; do
    [ -e "$stale" ] || continue
    log "removing the unfinished chroot $stale"
    safe_rm "$stale"
done

if [ -e "$ROOT" ] && { [ "${TORCHPROBE_DEBIAN13_REBUILD:-0}" = 1 ] \
        || [ ! -x "$ROOT/usr/bin/apt-get" ] || [ ! -x "$ROOT/bin/sh" ]; }; then
    log "deleting the kept chroot $ROOT"
    safe_rm "$ROOT"
fi
[ -d "$ROOT" ] || bootstrap

mount_basics "$ROOT"
if [ "$(cat "$ROOT$STAMP_FILE" 2>/dev/null)" != "$STAMP_CONTENT" ]; then
    : > "$SETUP_LOG"
    install_packages "$ROOT"
fi
mkdir -p "$ROOT$SRC_IN_CHROOT"
mount --bind "$REPO_ROOT" "$ROOT$SRC_IN_CHROOT"
mount --make-rslave "$ROOT$SRC_IN_CHROOT"

if [ $# -eq 0 ]; then
    # The README's test command, one step per line, with its own build directory. Without the
    # examples (each a libtorch TU of 75-120 s of CPU here, about 3 min of CI's time for the four,
    # for API calls the test executables make too), which the Debian 12 run builds and runs. With
    # the command-line tool: its tests read the reference dumps in tests/data, and Chromium is in
    # the chroot for the report's, so every test but the CUDA ones runs here too (issue 49).
    # A Release build at -O1, and without the single header's test: this run is there for libtorch
    # 2.6 and g++ 14, which the same code in include/ meets in the other tests; -O3's optimizer and
    # the single header's second copy of the library cost ~8 min of CPU (~4 min of CI's time) and
    # check nothing more here. The Debian 12 run builds everything as README's command does.
    if [ "${TORCHPROBE_DEBIAN13_SANITIZE:-0}" = 1 ]; then
        # CI's sanitizer run: the same suite instrumented (ASan + UBSan, -O1, no debug information:
        # findings still name functions), so that libtorch 2.6 and the sanitizers cost one build,
        # not two (a separate Debian 12 sanitizer build took 32 min of CI's 90). Suppressions: only
        # findings proven to lie inside libtorch (each file gives its reasons).
        set -- /usr/bin/env TORCHPROBE_CI_JOBS="$JOBS" \
            "ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:check_initialization_order=1:strict_init_order=1" \
            "UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:suppressions=$SRC_IN_CHROOT/tests/sanitizers/ubsan.supp" \
            "LSAN_OPTIONS=suppressions=$SRC_IN_CHROOT/tests/sanitizers/lsan.supp:print_suppressions=1" \
            /bin/bash .ci/suite.sh debian13 "$BUILD_DIR" -DTORCHPROBE_SANITIZE=ON "-DCMAKE_CXX_FLAGS=-O1 -g0" \
            -DTORCHPROBE_BUILD_EXAMPLES=OFF -DTORCHPROBE_TEST_SINGLE_INCLUDE=OFF
    else
        set -- /usr/bin/env TORCHPROBE_CI_JOBS="$JOBS" /bin/bash .ci/suite.sh debian13 "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release \
            "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG" -DTORCHPROBE_BUILD_EXAMPLES=OFF -DTORCHPROBE_TEST_SINGLE_INCLUDE=OFF
    fi
fi

log "setup took $(since "$T_START") s (Debian $(cat "$ROOT/etc/debian_version"), repo at $SRC_IN_CHROOT)"
log "running: $*"
T_CMD=$(date +%s.%N)
rc=0
# shellcheck disable=SC2016  # expanded by the shell in the chroot
in_chroot "$ROOT" /bin/sh -c 'cd "$0" && exec "$@"' "$SRC_IN_CHROOT" "$@" || rc=$?
log "command took $(since "$T_CMD") s, exit status $rc (total $(since "$T_START") s)"
exit "$rc"
