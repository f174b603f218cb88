#!/usr/bin/env bash
# Where mc-client spends its time on the two get paths, with perf (cpu-clock, call graphs):
#   local  BatchGet of 16 x 16 MiB through client1, which holds the data (profiles client1)
#   cross  the same gets through client2, which reads from client1 over TCP (profiles both)
# For each path: mc-bench puts the keys, then gets for PROFILE_SECONDS; perf attaches after the
# puts and records the daemons. Prints the top self-time symbols per process and keeps the
# perf.data files in bench/run/. Needs `perf` (Debian linux-perf); hardware counters are not
# needed (cpu-clock is a software event). Environment: see bench/lib.sh; VALUE_SIZE, PROFILE_SECONDS.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
command -v perf >/dev/null || { echo "profile: perf missing (apt-get install linux-perf)" >&2; exit 1; }
size="${VALUE_SIZE:-16777216}"
secs="${PROFILE_SECONDS:-8}"
keys="$(keys_for "$size")"

start_mcstore
pid1="$(cat "$MC_RUN_DIR/client1.pid")"
pid2="$(cat "$MC_RUN_DIR/client2.pid")"

profile() {  # profile NAME PIDS MC-BENCH-ARGS...
  local name="$1" pids="$2"
  shift 2
  "$tools/mc-bench" --mode get --value_size "$size" --batch 16 --keys "$keys" \
    --seconds "$((secs + 4))" --runs 1 "$@" >"$MC_RUN_DIR/$name.bench" 2>&1 &
  local bench=$!
  started_pids+=("$bench")
  # Wait for the put phase to end (the get phase's first RPC shows in the daemon's metrics).
  sleep 3
  perf record -e cpu-clock -g -o "bench/run/perf-$name.data" -p "$pids" -- sleep "$secs" \
    >/dev/null 2>&1
  wait "$bench" || echo "profile: mc-bench ($name) exited $?" >&2
  grep '^mc-bench summary' "$MC_RUN_DIR/$name.bench" >&2 || true
  echo
  echo "== $name path: top self time (perf -e cpu-clock, bench/run/perf-$name.data) =="
  perf report -i "bench/run/perf-$name.data" --no-children --sort comm,dso,symbol --stdio \
    2>/dev/null | grep -E '^ +[0-9.]+%' | sed -E 's/ +- +- *$//; s/  +/  /g' | cut -c1-150 |
    awk -v n="${TOP:-25}" 'NR <= n'
}

profile local "$pid1" --client "$CLIENT1"
profile cross "$pid1,$pid2" --put_client "$CLIENT1" --client "$CLIENT2"
