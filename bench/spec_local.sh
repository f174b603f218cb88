#!/usr/bin/env bash
# Speculative local copies on the get path (--get_speculative_local), A/B in one run: one local
# cluster whose client1 speculates and client2 does not (SWAP=1: the other way round, to cancel
# out what differs between the two daemons), local gets into shm slices of 16 x 64 KiB and
# 16 x 1 MiB through each daemon's own Unix socket (its own puts: replicas in its own segments),
# interleaved, ROUNDS rounds. Each line: round, size, flag, p50/p99 ms (medians over RUNS runs of
# mc-bench), then the on/off ratios of each round; the load average at the start and the end.
#   ./bench/spec_local.sh          SWAP=1 ROUNDS=3 ITERATIONS=300 RUNS=3 ./bench/spec_local.sh
set -euo pipefail
export MC_AUTH="${MC_AUTH:-0}"
SWAP="${SWAP:-0}"
if [[ "$SWAP" == 1 ]]; then
  export MC_CLIENT1_ARGS="--get_speculative_local=false"
  on_client=2
else
  export MC_CLIENT2_ARGS="--get_speculative_local=false"
  on_client=1
fi
source "$(dirname "$0")/lib.sh"
ROUNDS="${ROUNDS:-3}"
ITERATIONS="${ITERATIONS:-300}"
RUNS="${RUNS:-3}"

start_mcstore
echo "bench: mcstore up ($MC_BUILD_DIR); speculating: client$on_client; ROUNDS=$ROUNDS" \
  "ITERATIONS=$ITERATIONS RUNS=$RUNS; load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
declare -A p50
for ((round = 1; round <= ROUNDS; round++)); do
  for size in 65536 1048576; do
    keys=$((size == 65536 ? 512 : 256))
    for c in 1 2; do
      flag=$([[ $c == "$on_client" ]] && echo on || echo off)
      line="$(mcbench --client "unix:$MC_RUN_DIR/client$c.sock" --mode both --value_size "$size" \
        --batch 16 --keys "$keys" --iterations "$ITERATIONS" --runs "$RUNS" --dest shm |
        grep 'summary op=get ' || true)"
      p50[$round.$size.$flag]="$(field "$line" p50_ms)"
      printf 'round %d get 16x%-7s speculative=%-3s client%d p50_ms=%s p99_ms=%s GB/s=%s\n' \
        "$round" "$size" "$flag" "$c" "$(field "$line" p50_ms)" "$(field "$line" p99_ms)" \
        "$(field "$line" GB/s)"
    done
  done
done
for ((round = 1; round <= ROUNDS; round++)); do
  for size in 65536 1048576; do
    printf 'round %d 16x%-7s p50 on/off = %s\n' "$round" "$size" "$(/usr/bin/python3 -c \
      'import sys; print(f"{float(sys.argv[1]) / float(sys.argv[2]):.3f}")' \
      "${p50[$round.$size.on]}" "${p50[$round.$size.off]}")"
  done
done
for c in 1 2; do
  http="$(ready_field "$MC_RUN_DIR/client$c.json" http)"
  printf 'client%d %s\n' "$c" "$(curl -s "http://$http/metrics" | grep '^mc_client_get_speculative_total' | tr '\n' ' ')"
done
echo "bench: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
