#!/usr/bin/env bash
# A run longer than one 10-minute device call: start it in its own process session (which the device tool leaves
# running when a call returns, until the machine goes back), then wait on it over several calls. Each next call
# must come within the machine's 30 s idle window, or the machine and the run are gone.
# From the repo root:
#   bash docs/benchmarks/scripts/detached.sh start NAME COMMAND...  # returns at once; COMMAND's $OUT is its own
#   bash docs/benchmarks/scripts/detached.sh wait NAME [SECONDS]     # follows the log until the run ends or
#                                                                    # SECONDS (default 570) pass
# `wait` copies the run's log and its $OUT into this call's $OUT/NAME/ and exits 0 once the run has ended
# (its exit status is in rc), 3 while it is still running.
set -uo pipefail
action=${1:?start or wait}; name=${2:?a name for the run}; shift 2
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
[[ $name =~ ^[A-Za-z0-9_-]+$ ]] || { echo "the run's name '$name' must be letters, digits, _ or -"; exit 2; }
home=/tmp/detached/$name
case "$action" in
  start)
    [ -f "$home/pid" ] && kill -0 "$(cat "$home/pid")" 2>/dev/null && { echo "$name is already running"; exit 1; }
    mkdir -p "$home/out"; rm -f "$home/rc"
    OUT=$home/out setsid bash -c '"$@" > "$0/log" 2>&1; echo $? > "$0/rc"' "$home" "$@" < /dev/null &
    echo $! > "$home/pid"
    echo "$name started (pid $(cat "$home/pid")): $*" ;;
  wait)
    [ -f "$home/pid" ] || { echo "no run named $name on this machine (a fresh machine?)"; exit 1; }
    limit=${1:-570}; start=$SECONDS
    while [ ! -f "$home/rc" ] && [ $((SECONDS - start)) -lt "$limit" ]; do sleep 5; done
    mkdir -p "$OUT/$name"; cp -r "$home/out/." "$OUT/$name/" 2>/dev/null; cp "$home/log" "$OUT/$name/log.txt"
    tail -25 "$home/log"
    if [ -f "$home/rc" ]; then echo "$name ended: rc $(cat "$home/rc")"; exit 0; fi
    echo "$name still running after ${limit}s; wait again"; exit 3 ;;
  *) echo "unknown action '$action': start or wait"; exit 2 ;;
esac
