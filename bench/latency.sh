#!/usr/bin/env bash
# Latency only, for quick A/B runs of two builds: starts a master and two mc-clients (like
# run_local.sh), then REPS times: MatchPrefix over 1,000 chained keys without and with a lease,
# and 64 x 64 KiB gets into shm slices, each ITERATIONS calls through client1's Unix socket.
# Prints one line per measurement (p50 / p99 ms). Stops everything it started on exit.
#   ./bench/latency.sh                     MC_BUILD_DIR=/path/to/other/build ./bench/latency.sh
#   REPS=5 ITERATIONS=500 ./bench/latency.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"
REPS="${REPS:-3}"
ITERATIONS="${ITERATIONS:-300}"

start_mcstore
echo "bench: mcstore up ($MC_BUILD_DIR); REPS=$REPS ITERATIONS=$ITERATIONS" >&2
for ((rep = 1; rep <= REPS; rep++)); do
  for lease in 0 30000; do
    line="$(mcbench --client "$CLIENT1_UNIX" --mode match_prefix --prefix_keys 1000 \
      --iterations "$ITERATIONS" --runs 1 --prefix_lease_ms "$lease" | grep 'op=match_prefix' || true)"
    printf 'match_prefix lease_ms=%-6s p50_ms=%s p99_ms=%s\n' "$lease" "$(field "$line" p50_ms)" \
      "$(field "$line" p99_ms)"
  done
  line="$(mcbench --client "$CLIENT1_UNIX" --mode get --value_size 65536 --batch 64 --keys 1024 \
    --iterations "$ITERATIONS" --runs 1 --dest shm | grep 'op=get' || true)"
  printf 'get_64x64KiB           p50_ms=%s p99_ms=%s\n' "$(field "$line" p50_ms)" \
    "$(field "$line" p99_ms)"
done
