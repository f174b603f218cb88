#!/usr/bin/env bash
# mcstore against its peers on this machine, for the same gets: values of 1, 4 and 16 MiB, 16 per
# request, all keys preloaded, every figure the median of RUNS runs.
#   mcstore   mc-bench BatchGet into shm slices: local (through the daemon holding the data) and
#             cross (through the other daemon, TCP data plane)
#   memcached mc-bench-memcached: text-protocol `get` of 16 keys per request over loopback TCP,
#             values received straight into destination slots (memcached -I 32m: a 16 MiB value
#             plus its item header does not fit -I 16m)
#   redis     redis-benchmark -t get -P 16 -c 1 over loopback TCP; GB/s = requests/s x value size
#   limits    mc-bench --baseline: memcpy of non-cache-resident blocks, loopback TCP stream
# Starts mcstore (deploy/local-cluster.sh), redis-server and memcached on free loopback ports and
# stops all of them on exit. Environment: see bench/lib.sh; SIZES overrides the value sizes.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
SIZES="${SIZES:-1048576 4194304 16777216}"

for bin in redis-server redis-cli redis-benchmark memcached "$tools/mc-bench-memcached"; do
  command -v "$bin" >/dev/null || { echo "compare: $bin missing (./deploy/install-deps.sh --bench; build mc-bench-memcached)" >&2; exit 1; }
done

start_mcstore
mkdir -p "$MC_RUN_DIR"
redis_port="$(free_port)"
redis-server --port "$redis_port" --bind 127.0.0.1 --save "" --appendonly no --maxmemory 6gb \
  --protected-mode no --daemonize no --dir "$MC_RUN_DIR" >"$MC_RUN_DIR/redis.log" 2>&1 &
started_pids+=($!)
memcached_port="$(free_port)"
memcached_user=()
[[ $(id -u) -eq 0 ]] && memcached_user=(-u root)
memcached "${memcached_user[@]}" -I 32m -m 4096 -l 127.0.0.1 -p "$memcached_port" -U 0 \
  >"$MC_RUN_DIR/memcached.log" 2>&1 &
started_pids+=($!)
for _ in $(seq 1 50); do
  redis-cli -p "$redis_port" ping >/dev/null 2>&1 && break
  sleep 0.1
done
for _ in $(seq 1 50); do
  (exec 3<>"/dev/tcp/127.0.0.1/$memcached_port") 2>/dev/null && break
  sleep 0.1
done
echo "compare: mcstore $CLIENT1/$CLIENT2, redis :$redis_port, memcached :$memcached_port; RUNS=$RUNS" >&2

baseline

redis_get() {  # redis_get SIZE KEYS: median GB/s and median p50/p99 ms (per request) of RUNS runs
  local size="$1" keys="$2" n rps all=() p50s=() p99s=() line
  redis-cli -p "$redis_port" flushall >/dev/null
  head -c "$size" /dev/urandom >"$MC_RUN_DIR/value.bin"
  for k in $(seq 0 $((keys - 1))); do
    redis-cli -p "$redis_port" -x set "$(printf 'key:%012d' "$k")" <"$MC_RUN_DIR/value.bin" >/dev/null
  done
  n=$(( (2 << 30) / size )); (( n < 320 )) && n=320
  for _ in $(seq 1 "$RUNS"); do
    line="$(redis-benchmark -h 127.0.0.1 -p "$redis_port" -c 1 -P 16 -n "$n" -r "$keys" -t get --csv 2>/dev/null | grep '^"GET')"
    echo "redis run size=$size $line" >>"$MC_RUN_DIR/bench.log"
    rps="$(cut -d, -f2 <<<"$line" | tr -d '"')"
    all+=("$(awk -v r="$rps" -v s="$size" 'BEGIN { printf "%.3f", r * s / 1e9 }')")
    p50s+=("$(cut -d, -f5 <<<"$line" | tr -d '"')")
    p99s+=("$(cut -d, -f7 <<<"$line" | tr -d '"')")
  done
  redis-cli -p "$redis_port" flushall >/dev/null
  echo "$(printf '%s\n' "${all[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') \
$(printf '%s\n' "${p50s[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') \
$(printf '%s\n' "${p99s[@]}" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')"
}

rows=()
for size in $SIZES; do
  keys="$(keys_for "$size")"
  iters=$(( size >= 16777216 ? 8 : 20 ))
  common=(--value_size "$size" --batch 16 --keys "$keys" --iterations "$iters" --runs "$RUNS" --dest shm)
  local_line="$(mcbench --client "$CLIENT1" --mode get "${common[@]}")"
  cross_line="$(mcbench --put_client "$CLIENT1" --client "$CLIENT2" --mode get "${common[@]}")"
  lget="$(field "$local_line" GB/s)"
  cget="$(field "$cross_line" GB/s)"
  mc_out="$("$tools/mc-bench-memcached" --server "127.0.0.1:$memcached_port" --value_size "$size" \
    --batch 16 --keys "$keys" --iterations "$iters" --runs "$RUNS" --key_prefix "s$size" 2>&1 || true)"
  printf '%s\n' "$mc_out" >>"$MC_RUN_DIR/bench.log"
  mcd="$(field "$(grep '^memcached summary' <<<"$mc_out" || true)" GB/s)"
  [[ -n "$mcd" ]] || { echo "compare: memcached run failed: $(tail -2 <<<"$mc_out")" >&2; mcd="-"; }
  read -r rds rds_p50 rds_p99 <<<"$(redis_get "$size" "$keys")"
  mcp="$(memcpy_for "$size")"
  rows+=("$(printf '%-7s %8s %8s %9s %7s %7s %6s | %8s %8s %8s %8s %8s %8s' "$(mib "$size")" \
    "$lget" "$cget" "$mcd" "$rds" "$mcp" "$TCP_GBPS" \
    "$(ratio "$lget" "$mcd")" "$(ratio "$cget" "$mcd")" "$(ratio "$lget" "$rds")" \
    "$(ratio "$cget" "$rds")" "$(ratio "$lget" "$mcp")" "$(ratio "$cget" "$TCP_GBPS")")")
  echo "compare: $(mib "$size") done (redis p50/p99 per request: $rds_p50/$rds_p99 ms)" >&2
done

echo
echo "mcstore vs peers, GET GB/s, batch/pipeline 16, $(date -u +%F), $(nproc) cores, medians of $RUNS runs"
printf '%-7s %8s %8s %9s %7s %7s %6s | %8s %8s %8s %8s %8s %8s\n' value mc_local mc_cross memcached redis memcpy tcp \
  L/mcd X/mcd L/redis X/redis L/memcpy X/tcp
printf '%s\n' "${rows[@]}"
echo "(L = mcstore local path, X = mcstore cross-daemon TCP path, mcd = memcached)"
