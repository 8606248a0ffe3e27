#!/usr/bin/env bash
# Starts N ranks of a program on this machine, as torchrun sets them up, with no Python:
#
#   tools/launch_ranks.sh [-t SECONDS] [-p PORT] N PROGRAM [ARGS...]
#
# Rank r runs PROGRAM with RANK=r, LOCAL_RANK=r, WORLD_SIZE=N, LOCAL_WORLD_SIZE=N,
# MASTER_ADDR=127.0.0.1 and MASTER_PORT=PORT (default 29500). It waits for them all. When a
# rank fails, the others are killed (as torchrun does) and its status is this script's; after
# SECONDS (default 600) everything is killed and the status is 124. Whatever ends the script
# (failure, timeout, Ctrl-C, SIGTERM), no rank is left running. Each rank's output is prefixed
# with nothing; redirect it per rank in PROGRAM if you need to tell them apart.
set -u

timeout_s=600
port=29500
while getopts "t:p:" opt; do
  case $opt in
    t) timeout_s=$OPTARG ;;
    p) port=$OPTARG ;;
    *) echo "usage: $0 [-t SECONDS] [-p PORT] N PROGRAM [ARGS...]" >&2; exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -lt 2 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: $0 [-t SECONDS] [-p PORT] N PROGRAM [ARGS...]" >&2
  exit 2
fi
world=$1
shift

pids=()
teardown() {
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
}
trap teardown EXIT
trap 'echo "launch_ranks: interrupted: killing every rank" >&2; exit 130' INT TERM

for ((r = 0; r < world; r++)); do
  RANK=$r LOCAL_RANK=$r WORLD_SIZE=$world LOCAL_WORLD_SIZE=$world MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$@" &
  pids+=($!)
done

# Polled, not `wait -n PIDS`: a rank killed by a signal is reported ("Killed") and dropped from the
# job table by bash as soon as it is reaped, and `wait -n` then answers "no such job" for it and
# waits on the others: a launch whose last rank was killed hung until the timeout. `wait PID` still
# answers the status of a child bash has reaped, so a rank that is gone is asked for it there.
declare -A rank_of
for ((r = 0; r < world; r++)); do rank_of[${pids[$r]}]=$r; done
running=("${pids[@]}")
deadline=$((SECONDS + timeout_s))
while [ "${#running[@]}" -gt 0 ]; do
  for i in "${!running[@]}"; do
    pid=${running[$i]}
    kill -0 "$pid" 2>/dev/null && continue  # still running (or not yet reaped: asked again next round)
    wait "$pid"
    status=$?
    unset 'running[i]'
    if [ "$status" -ne 0 ]; then
      echo "launch_ranks: rank ${rank_of[$pid]} (pid $pid) ended with status $status: killing the others" >&2
      exit "$status"
    fi
  done
  [ "${#running[@]}" -eq 0 ] && break
  if [ "$SECONDS" -ge "$deadline" ]; then
    echo "launch_ranks: timed out after ${timeout_s} s: killing every rank" >&2
    exit 124
  fi
  sleep 0.05
done
exit 0
