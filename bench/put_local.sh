#!/usr/bin/env bash
# Local-path BatchPut: put GB/s of 64 KiB, 1, 4 and 16 MiB values (batches of 16, shm slices)
# through client1 into its own segment, beside this machine's memcpy of the same block size, and
# the CPU the daemons spent per GB put, and client1's CPU per GB it wrote (utime+stime from /proc
# over all runs of a size, divided by its own mc_transfer_bytes_total{transport="local",op="write"};
# finer than the daemons' figure, which counts one run at a time). A put copies each value into the
# segment and records its XXH3-64: the ratio to memcpy shows what the checksum costs on top of the
# copy. RUNS times each, medians. Stops everything it started on exit. Environment: see
# bench/lib.sh (MC_BUILD_DIR, RUNS); PUT_MIB: MiB of values put per run (keys = PUT_MIB / value
# size, 32-2048; default: bench/lib.sh's keys_for), more for a finer CPU figure.
#   ./bench/put_local.sh        RUNS=3 MC_BUILD_DIR=/other/build ./bench/put_local.sh
#   RUNS=5 PUT_MIB=256 ./bench/put_local.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start_mcstore
echo "bench: mcstore up (client1 $CLIENT1); RUNS=$RUNS; log: $MC_RUN_DIR/bench.log" >&2
baseline
memcpy_64k="$(field "$("$tools/mc-bench" --baseline --runs "$RUNS" --baseline_blocks 64KiB |
  grep 'baseline memcpy block=65536 ')" GB/s)"

pid="$(cat "$MC_RUN_DIR/client1.pid")"
http="$(ready_field "$MC_RUN_DIR/client1.json" http)"
hz="$(getconf CLK_TCK)"
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
local_writes() {
  curl -s "http://$http/metrics" |
    awk '/^mc_transfer_bytes_total\{/ && /transport="local"/ && /op="write"/ { print $2; exit }'
}

rows=()
for size in 65536 1048576 4194304 16777216; do
  if [[ -n "${PUT_MIB:-}" ]]; then
    keys=$(( (PUT_MIB << 20) / size ))
    (( keys > 2048 )) && keys=2048
    (( keys < 32 )) && keys=32
  else
    keys="$(keys_for "$size")"
  fi
  t0="$(cpu_ticks)"
  b0="$(local_writes)"
  iters=$(( size >= 16777216 ? 8 : size <= 65536 ? 200 : 20 ))
  line="$(mcbench --client "$CLIENT1" --mode put --value_size "$size" --batch 16 --keys "$keys" \
    --iterations "$iters" --runs "$RUNS" --dest shm | grep 'op=put' || true)"
  cpu="$(awk -v t="$(( $(cpu_ticks) - t0 ))" -v b0="$b0" -v b1="$(local_writes)" -v hz="$hz" \
    'BEGIN { if (b1 - b0 > 0) printf "%.0f", t / hz * 1000 / ((b1 - b0) / 1e9); else print "-" }')"
  mcp="$(if [[ $size -eq 65536 ]]; then echo "$memcpy_64k"; else memcpy_for "$size"; fi)"
  rows+=("$(printf '%-7s %9s %9s %13s %9s %9s %17s %19s' "$(mib "$size")" "$(field "$line" GB/s)" \
    "$mcp" "$(ratio "$(field "$line" GB/s)" "$mcp")" "$(field "$line" p50_ms)" \
    "$(field "$line" p99_ms)" "$(field "$line" daemons_cpu_s/GB)" "$cpu")")
done

echo
echo "mcstore local-path puts, $(date -u +%F), $(nproc) cores, medians of $RUNS runs, build $MC_BUILD_DIR"
printf '%-7s %9s %9s %13s %9s %9s %17s %19s\n' value put_GB/s memcpy put/memcpy p50_ms p99_ms \
  daemons_cpu_s/GB client1_cpu_ms/GB
printf '%s\n' "${rows[@]}"
