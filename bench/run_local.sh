#!/usr/bin/env bash
# Local mcstore throughput: starts a master and two mc-clients on loopback (deploy/local-cluster.sh,
# 1 GiB segments), then measures with mc-bench, RUNS times each (tables show medians):
#   - BatchPut / BatchGet of 1, 4, 16 MiB values into shm slices, batches of 16:
#       local path  put and get through client1 (the data lives in client1's segment)
#       cross path  put through client1, get through client2 (TCP data plane)
#   - this machine's limits: memcpy of non-cache-resident blocks, loopback TCP stream
#   - small values: 64 KiB, batch 64, through client1's Unix socket (shm slices and inline)
#   - MatchPrefix over 1,000 chained keys through client1's Unix socket (p50/p99)
# Stops everything it started on exit. Environment: see bench/lib.sh (MC_BUILD_DIR, RUNS, ...).
#   ./bench/run_local.sh            RUNS=3 ./bench/run_local.sh
set -euo pipefail
source "$(dirname "$0")/lib.sh"

start_mcstore
echo "bench: mcstore up (client1 $CLIENT1, client2 $CLIENT2); RUNS=$RUNS; log: $MC_RUN_DIR/bench.log" >&2
baseline

rows=()
for size in 1048576 4194304 16777216; do
  keys="$(keys_for "$size")"
  iters=$(( size >= 16777216 ? 8 : 20 ))
  common=(--value_size "$size" --batch 16 --keys "$keys" --iterations "$iters" --runs "$RUNS" --dest shm)
  local_out="$(mcbench --client "$CLIENT1" --mode both "${common[@]}")"
  cross_out="$(mcbench --put_client "$CLIENT1" --client "$CLIENT2" --mode get "${common[@]}")"
  lput="$(field "$(grep 'op=put' <<<"$local_out")" GB/s)"
  lget_line="$(grep 'op=get' <<<"$local_out")"
  cget_line="$(grep 'op=get' <<<"$cross_out")"
  lget="$(field "$lget_line" GB/s)"
  cget="$(field "$cget_line" GB/s)"
  mcp="$(memcpy_for "$size")"
  rows+=("$(printf '%-7s %9s %9s %9s %11s %9s %9s %9s %9s' "$(mib "$size")" "$lput" "$lget" "$cget" \
    "$(ratio "$lget" "$mcp")" "$(ratio "$cget" "$TCP_GBPS")" "$(ratio "$cget" "$lget")" \
    "$(field "$lget_line" p99_ms)" "$(field "$cget_line" p99_ms)")")
done

small=()
for dest in shm inline; do
  line="$(mcbench --client "$CLIENT1_UNIX" --mode get --value_size 65536 --batch 64 --keys 1024 \
    --iterations 200 --runs "$RUNS" --dest "$dest" | grep 'op=get' || true)"
  small+=("$(printf '%-7s %9s %11s %9s %9s %9s' "$dest" "$(field "$line" GB/s)" \
    "$(field "$line" items/s)" "$(field "$line" p50_ms)" "$(field "$line" p99_ms)" "$(field "$line" max_ms)")")
done

# MatchPrefix over a chain of 1,000 keys (4 KiB values), without and with a lease.
prefix=()
for lease in 0 5000; do
  line="$(mcbench --client "$CLIENT1_UNIX" --mode match_prefix --prefix_keys 1000 --iterations 200 \
    --runs "$RUNS" --prefix_lease_ms "$lease" | grep 'op=match_prefix' || true)"
  prefix+=("$(printf '%-9s %9s %9s %9s %9s' "$lease" "$(field "$line" p50_ms)" \
    "$(field "$line" p90_ms)" "$(field "$line" p99_ms)" "$(field "$line" max_ms)")")
done

echo
echo "mcstore local benchmark, $(date -u +%F), $(nproc) cores, medians of $RUNS runs"
echo "machine limits: memcpy GB/s 1 MiB $MEMCPY_1M | 4 MiB $MEMCPY_4M | 16 MiB $MEMCPY_16M;  loopback TCP GB/s $TCP_GBPS"
echo
printf '%-7s %9s %9s %9s %11s %9s %9s %9s %9s\n' value put_GB/s local_get cross_get local/memcpy cross/tcp cross/local l_p99_ms c_p99_ms
printf '%s\n' "${rows[@]}"
echo
echo "small values: 64 KiB x 64 per BatchGet, Unix socket, client1"
printf '%-7s %9s %11s %9s %9s %9s\n' dest GB/s items/s p50_ms p99_ms max_ms
printf '%s\n' "${small[@]}"
echo
echo "MatchPrefix over 1000 chained keys, Unix socket, client1"
printf '%-9s %9s %9s %9s %9s\n' lease_ms p50_ms p90_ms p99_ms max_ms
printf '%s\n' "${prefix[@]}"
