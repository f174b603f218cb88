#!/usr/bin/env bash
# Store calls over gRPC vs the fast channel (<unix_socket>.fast), interleaved in one run against
# one local cluster (master + 2 mc-clients, MC_AUTH=0 as the other benches): local gets into shm
# slices and puts from them, 16 x 64 KiB and 16 x 1 MiB, through client1's Unix socket. Each
# line: the path, the measurement, p50/p99 ms and GB/s (medians over RUNS runs of mc-bench).
#   ./bench/fast_channel.sh          REPS=3 ITERATIONS=500 RUNS=3 ./bench/fast_channel.sh
set -euo pipefail
export MC_AUTH="${MC_AUTH:-0}"
source "$(dirname "$0")/lib.sh"
REPS="${REPS:-2}"
ITERATIONS="${ITERATIONS:-300}"
RUNS="${RUNS:-3}"

start_mcstore
echo "bench: mcstore up ($MC_BUILD_DIR); REPS=$REPS ITERATIONS=$ITERATIONS RUNS=$RUNS" >&2
for ((rep = 1; rep <= REPS; rep++)); do
  for size in 65536 1048576; do
    keys=$((size == 65536 ? 512 : 256))
    for fast in false true; do
      # --mode both: the puts of each run's keys, then the gets of them.
      out="$(mcbench --client "$CLIENT1_UNIX" --mode both --value_size "$size" --batch 16 \
        --keys "$keys" --iterations "$ITERATIONS" --runs "$RUNS" --dest shm --store_fast="$fast")"
      for op in put get; do
        line="$(grep "summary op=$op " <<<"$out" || true)"
        printf '%-4s %s 16x%-7s p50_ms=%s p99_ms=%s GB/s=%s\n' "$(field "$line" path)" "$op" \
          "$size" "$(field "$line" p50_ms)" "$(field "$line" p99_ms)" "$(field "$line" GB/s)"
      done
    done
  done
done
